from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core.errors import ApplicationError
from apps.fleet import services
from apps.fleet.models import Gpu, GpuModel, Node


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin[GpuModel]):
    list_display = ("name", "display_name", "memory_mib", "hourly_price")
    search_fields = ("name",)


class GpuInline(admin.TabularInline[Gpu, Node]):
    model = Gpu
    extra = 0
    fields = ("index", "uuid", "model", "memory_mib", "mig_mode", "status", "probed_at", "retired_at")
    readonly_fields = ("probed_at", "retired_at")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin[Node]):
    list_display = ("name", "status", "draining", "last_heartbeat", "backend", "agent_version", "token_prefix")
    list_filter = ("status", "draining", "backend")
    search_fields = ("name", "hostname")
    inlines = [GpuInline]
    readonly_fields = (
        "status",
        "last_heartbeat",
        "last_seen",
        "registered_at",
        "agent_version",
        "driver_version",
        "hostname",
        "backend",
        "token_prefix",
        "token_created_at",
        "created_at",
    )
    exclude = ("token_digest",)
    actions = ["issue_token", "drain", "undrain"]

    @admin.action(description="Issue a new node token (shown once; the old token stops working)")
    def issue_token(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset:
            _, plaintext = services.node_token_issue(node_name=node.name, actor=request.user)
            self.message_user(
                request,
                f"Token for {node.name} (copy it now, it is not shown again): {plaintext}",
                level=messages.WARNING,
            )

    @admin.action(description="Drain: take no new work")
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        names = [node.name for node in queryset]
        for name in names:
            services.node_drain(actor=request.user, node_name=name, draining=True)
        self.message_user(request, f"Draining (no new work): {', '.join(names)}.")

    @admin.action(description="Undrain: take work again")
    def undrain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        names = [node.name for node in queryset]
        for name in names:
            services.node_drain(actor=request.user, node_name=name, draining=False)
        self.message_user(request, f"Taking work again: {', '.join(names)}.")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin[Gpu]):
    list_display = ("uuid", "node", "index", "model", "status", "mig_mode", "probed_at", "retired_at")
    list_filter = ("status", "model", "node", "mig_mode")
    search_fields = ("uuid", "node__name", "name")
    readonly_fields = ("probe", "probed_at", "retired_at")
    actions = ["run_probe"]

    @admin.action(description="Run the health probe on the selected GPUs")
    def run_probe(self, request: HttpRequest, queryset: QuerySet[Gpu]) -> None:
        sent = 0
        for gpu in queryset:
            try:
                services.gpu_probe_request(actor=request.user, gpu_uuid=gpu.uuid)
                sent += 1
            except ApplicationError as exc:
                self.message_user(request, f"{gpu.uuid}: {exc.detail}", level=messages.ERROR)
        if sent:
            self.message_user(request, f"Probe requested on {sent} GPU(s); results appear on each GPU.")

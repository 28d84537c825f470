from django.contrib import admin

from apps.fleet.models import Gpu, GpuModel, Node


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ("name", "display_name", "memory_mib", "hourly_price")
    search_fields = ("name",)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "uuid", "model", "memory_mib", "status")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "last_heartbeat", "agent_version")
    list_filter = ("status",)
    search_fields = ("name",)
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("uuid", "node", "index", "model", "status")
    list_filter = ("status", "model", "node")
    search_fields = ("uuid", "node__name")

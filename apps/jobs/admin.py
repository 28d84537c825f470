from django.contrib import admin

from apps.jobs.models import ContainerImage, Job, JobEvent, SchedulerState, TeamJobPolicy


@admin.register(ContainerImage)
class ContainerImageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "description", "enabled", "created_at")
    list_filter = ("enabled",)
    search_fields = ("name", "description")


@admin.register(TeamJobPolicy)
class TeamJobPolicyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("team", "max_priority", "max_duration_s", "max_gpus_per_job", "max_queued_jobs")


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ("at", "from_state", "to_state", "reason", "message")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-mostly: states change only through the services (cancel from the job page or the API)."""

    list_display = ("id", "name", "team", "user", "image", "gpu_count", "state", "reason", "node", "submitted_at")
    list_select_related = ("team", "user", "node")
    list_filter = ("state", "reason", "team")
    search_fields = ("name", "image", "user__username")
    inlines = [JobEventInline]
    readonly_fields = [f.name for f in Job._meta.fields] + ["gpus"]

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(SchedulerState)
class SchedulerStateAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("leader", "fence", "last_pass_at", "last_pass_ms", "pending", "passes")
    readonly_fields = ("leader", "fence", "last_pass_at", "last_pass_ms", "last_started", "pending", "passes")

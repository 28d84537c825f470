from django.contrib import admin

from apps.efficiency.models import IdleExemption, IdleMark, IdlePolicy, WaitlistEntry


@admin.register(IdlePolicy)
class IdlePolicyAdmin(admin.ModelAdmin[IdlePolicy]):
    list_display = [
        "team",
        "enabled",
        "warn_after_min",
        "reclaim_after_min",
        "utilization_below_pct",
        "memory_below_pct",
        "applies_to",
        "unused_release_after_min",
    ]
    list_select_related = ["team"]


@admin.register(IdleExemption)
class IdleExemptionAdmin(admin.ModelAdmin[IdleExemption]):
    list_display = ["kind", "source_id", "team", "extra_min", "reason", "created_at"]
    list_select_related = ["team"]
    list_filter = ["kind"]


@admin.register(IdleMark)
class IdleMarkAdmin(admin.ModelAdmin[IdleMark]):
    list_display = ["kind", "source_id", "team", "user", "state", "loaded", "warned_at", "reclaimed_at"]
    list_select_related = ["team", "user"]
    list_filter = ["state", "kind"]
    readonly_fields = [f.name for f in IdleMark._meta.fields]


@admin.register(WaitlistEntry)
class WaitlistEntryAdmin(admin.ModelAdmin[WaitlistEntry]):
    list_display = ["user", "team", "gpu_model", "gpu_count", "start", "end", "auto_book", "state", "created_at"]
    list_select_related = ["user", "team", "gpu_model"]
    list_filter = ["state"]

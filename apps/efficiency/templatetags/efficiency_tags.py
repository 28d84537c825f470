"""`{% load efficiency_tags %}{% idle_banner %}`: the banner on every page for a user whose reservations or jobs
are idle (the warnings open now), and the teams whose sockets the banner script listens on for new ones."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("efficiency/_idle_banner.html", takes_context=True)
def idle_banner(context: template.Context) -> dict[str, Any]:
    from apps.accounts.models import Team
    from apps.efficiency.selectors import warnings_for

    user = context.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return {"show": False}
    slugs = list(Team.objects.filter(memberships__user=user).values_list("slug", flat=True))
    return {"show": True, "marks": warnings_for(user_id=user.pk), "slugs": ",".join(slugs), "user_id": user.pk}


@register.inclusion_tag("efficiency/_job_panel.html")
def job_efficiency_panel(job: Any) -> dict[str, Any]:
    """The job page's GPU memory and utilization over the job's life, its OOM kind and the advice."""
    from apps.efficiency.jobinfo import job_efficiency

    eff = job_efficiency(job)
    return {
        "job": job,
        "eff": eff,
        "chart": {"series": eff.series, "peak": eff.gpu_memory_peak_mib, "total": eff.gpu_memory_total_mib},
    }

from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Prices, the usage ledger, live month-to-date cost, budgets, monthly reports and month closes."""

    name = "apps.billing"
    label = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from apps.billing import conf

        # Every task is idempotent, so a missed or doubled tick is harmless; messages expire with their period so
        # a worker that was down does not find a backlog of identical runs.
        schedule = {
            "billing-close-ledger": ("billing.close_ledger", conf.CLOSE_EVERY_S),
            "billing-live-costs": ("billing.broadcast_team_costs", conf.LIVE_EVERY_S),
            "billing-close-months": ("billing.close_months", conf.MONTH_CLOSE_EVERY_S),
        }
        for name, (task, every) in schedule.items():
            settings.CELERY_BEAT_SCHEDULE.setdefault(
                name, {"task": task, "schedule": float(every), "options": {"queue": "portal", "expires": every}}
            )

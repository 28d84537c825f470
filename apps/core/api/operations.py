"""The OpenAPI schema's words for each operation: a summary of its own (generated clients name their methods and
docs after it) and, where one view serves several methods, a description per method. The views' docstrings are the
default description; the hook in apps/core/api/schema.py applies this table and falls back to a summary built from
the operation id, so a new endpoint still gets one of its own."""

from __future__ import annotations

# operationId -> (summary, description or None to keep the view's)
OPERATIONS: dict[str, tuple[str, str | None]] = {
    "availability_retrieve": ("Free GPUs in a time window", None),
    "booking_quota_retrieve": ("A team's quota and what a booking would count", None),
    "booking_timeline_retrieve": ("Who holds which GPU in a time window", None),
    "gpu_models_list": ("List GPU models and prices", None),
    "gpus_list": (
        "List GPUs with live telemetry",
        "GPUs with status and latest telemetry (utilization %, memory used, temperature, power, sampled_at); the "
        "live figures are null for a GPU that never reported.",
    ),
    "gpus_history_retrieve": ("A GPU's telemetry history", None),
    "gpus_probe_create": ("Run the health probe on a GPU", None),
    "group_mappings_list": ("List directory group mappings", None),
    "group_mappings_create": ("Map a directory group to a team and role", None),
    "group_mappings_destroy": ("Delete a directory group mapping", "Delete a directory group mapping (admin)."),
    "health_retrieve": ("Liveness and readiness", None),
    "images_list": ("List allowed container images", None),
    "jobs_list": ("List jobs", "Jobs you can see, newest first (filters: state, team, user)."),
    "jobs_create": (
        "Submit a job",
        "Queue a job. Send an `Idempotency-Key` header so that a retried request never queues it twice: a retry "
        "with the same key gets the first answer.",
    ),
    "jobs_retrieve": ("Get a job", None),
    "jobs_cancel_create": ("Cancel a job", None),
    "jobs_logs_retrieve": ("Read a job's log lines", None),
    "me_retrieve": ("The signed-in user", None),
    "me_notifications_retrieve": ("Your mail preferences", None),
    "me_notifications_partial_update": ("Change your mail preferences", None),
    "nodes_list": ("List nodes", None),
    "nodes_drain_create": ("Drain a node", None),
    "nodes_undrain_create": ("Undrain a node", None),
    "pools_retrieve": ("List pools", None),
    "pools_bridge_jobs_logs_create": ("Bridge: a batch of a job's log lines", None),
    "pools_bridge_jobs_report_create": ("Bridge: a job's state in the scheduler", None),
    "pools_bridge_jobs_submitted_create": ("Bridge: a job was submitted or refused", None),
    "pools_bridge_poll_create": ("Bridge: poll for work", None),
    "prices_list": ("List GPU model prices", "Price history of every GPU model (`gpu_model` filter)."),
    "prices_create": (
        "Set a GPU model's price",
        "Set a price from a date on (admins); a date that would change a closed month is refused (400 `month_closed`).",
    ),
    "reports_monthly_retrieve": ("A month's usage and cost report", None),
    "reservations_list": ("List reservations", "Reservations of your teams (admins: all), filterable."),
    "reservations_create": (
        "Book GPUs",
        "Book GPUs for a time window: a count (and model), or named GPUs. Send an `Idempotency-Key` header so "
        "that a retried request never books twice: a retry with the same key gets the first answer.",
    ),
    "reservations_retrieve": ("Get a reservation", "One reservation."),
    "reservations_destroy": (
        "Cancel or release a reservation",
        "Cancel a reservation before its start, or release it early after (its GPUs are free at once).",
    ),
    "teams_list": ("List teams", None),
    "teams_retrieve": ("Get a team", None),
    "teams_idle_policy_retrieve": ("A team's idle policy", "A team's idle policy (its members and admins)."),
    "teams_idle_policy_partial_update": ("Change a team's idle policy", "Change a team's idle policy (admins)."),
    "tokens_list": ("List your API tokens", "Your personal API tokens (without their values)."),
    "tokens_create": (
        "Create an API token",
        "Create a personal API token; its value is returned once, in this answer.",
    ),
    "tokens_destroy": ("Revoke an API token", "Revoke one of your API tokens."),
    "usage_list": ("List usage ledger rows", None),
    "webhooks_list": ("List webhook endpoints", "Webhook endpoints of the teams you manage (admins: all)."),
    "webhooks_create": (
        "Create a webhook endpoint",
        "Create a webhook endpoint for a team you manage; its signing secret is returned once, in this answer.",
    ),
    "webhooks_destroy": ("Delete a webhook endpoint", "Delete a webhook endpoint of a team you manage."),
    "webhooks_deliveries_list": ("List a webhook endpoint's deliveries", None),
    "webhooks_rotate_secret_create": ("Rotate a webhook endpoint's signing secret", None),
}

# Component descriptions that were about the code, not the API.
COMPONENTS: dict[str, str] = {
    "JobInputRequest": "A job to submit.",
}

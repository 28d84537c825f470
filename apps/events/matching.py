"""Which event types an endpoint's patterns select, and which mail preference an event type falls under: pure."""

from __future__ import annotations

from apps.events.models import EventType

# The patterns an endpoint may subscribe to: every type, or a family ("job.*"), or "*".
KNOWN_TYPES: frozenset[str] = frozenset(t.value for t in EventType)
KNOWN_FAMILIES: frozenset[str] = frozenset(t.split(".")[0] for t in KNOWN_TYPES)

# Event type -> the MailPreference field that opts a person in.
MAIL_PREFERENCE: dict[str, str] = {
    EventType.JOB_SUCCEEDED: "job_finished",
    EventType.JOB_CANCELLED: "job_finished",
    EventType.JOB_FAILED: "job_failed",
    EventType.JOB_LOST: "job_failed",
    EventType.RESERVATION_STARTING_SOON: "reservation_starting",
    EventType.IDLE_WARNING: "idle_warnings",
    EventType.IDLE_RECLAIMED: "idle_warnings",
}
# budget.threshold is not mailed from here: billing mails the team's managers with the alert itself (worded for
# people, at once), honouring MailPreference.budget_thresholds; one mail per alert, not two.
# Mailed to the person named on the event whatever their preferences: it is about something they own.
ALWAYS_MAILED: frozenset[str] = frozenset({EventType.WEBHOOK_DISABLED, EventType.WAITLIST_AVAILABLE})


def pattern_is_valid(pattern: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith(".*"):
        return pattern[:-2] in KNOWN_FAMILIES
    return pattern in KNOWN_TYPES


def selects(patterns: list[str], event_type: str) -> bool:
    """Whether any of `patterns` ("*", "job.*", "node.down") selects `event_type`."""
    family = event_type.split(".")[0]
    return any(p == "*" or p == event_type or p == f"{family}.*" for p in patterns)


def backoff_s(attempts: int, *, base_s: int, max_s: int) -> int:
    """Seconds to wait after the `attempts`-th failed try: base, 2 x base, 4 x base, ... capped at max."""
    return int(min(max_s, base_s * 2 ** max(0, min(attempts - 1, 30))))

"""Forms of the webhooks and mail-notification pages (validation and authorization stay in services)."""

from __future__ import annotations

from typing import Any

from django import forms

from apps.events.models import MailPreference

EVENT_CHOICES = [
    ("job.*", "Jobs: queued, running, succeeded, failed, cancelled, lost"),
    ("reservation.*", "Reservations: created, starting soon, started, moved, ended, released"),
    ("budget.threshold", "Budget thresholds"),
    ("idle.*", "Idle GPUs: warnings and reclaims"),
    ("node.*", "Nodes down and up"),
    ("waitlist.*", "Waitlisted GPUs available"),
    ("webhook.*", "This webhook disabled for failing"),
]
ALL_TEAMS = "*"


class WebhookForm(forms.Form):
    team = forms.ChoiceField(choices=())
    url = forms.URLField(max_length=500, label="URL", assume_scheme="https")
    events = forms.MultipleChoiceField(choices=EVENT_CHOICES, widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args: Any, teams: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team = self.fields["team"]
        assert isinstance(team, forms.ChoiceField)
        team.choices = teams


class MailPreferenceForm(forms.ModelForm[MailPreference]):
    class Meta:
        model = MailPreference
        fields = ["job_finished", "job_failed", "reservation_starting", "idle_warnings", "budget_thresholds"]
        labels = {
            "job_finished": "My jobs that finish (succeeded or cancelled)",
            "job_failed": "My jobs that fail or are lost",
            "reservation_starting": "My reservations, shortly before they start",
            "idle_warnings": "Idle warnings and reclaims for my GPUs",
            "budget_thresholds": "Budget thresholds of the teams I manage",
        }

"""The submit form of the jobs page: argv one argument per line, env one NAME=value per line."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.utils import timezone

from apps.booking.models import Reservation
from apps.jobs import conf


def reservation_label(reservation: Reservation, *, now: datetime) -> str:
    """How a reservation reads in a select: id, GPUs, local start and end, and whether it is on now."""
    start, end = timezone.localtime(reservation.start), timezone.localtime(reservation.end)
    until = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%a %d %b %H:%M}"
    on_now = " (now)" if reservation.start <= now < reservation.end else ""
    return f"#{reservation.pk} · {reservation.size_text} · {start:%a %d %b %H:%M} to {until}{on_now}"


class JobForm(forms.Form):
    team = forms.ChoiceField()
    name = forms.CharField(max_length=200, required=False, help_text="optional; shown in lists and notifications")
    image = forms.ChoiceField(label="Container image")
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "python\ntrain.py\n--epochs=3"}),
        help_text="one argument per line (argv; no shell)",
    )
    env = forms.CharField(
        label="Environment",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "NAME=value"}),
        required=False,
        help_text="one NAME=value per line",
    )
    gpu_count = forms.IntegerField(min_value=1, initial=1, label="GPUs", help_text="whole GPUs, on one node")
    gpu_model = forms.ChoiceField(required=False, label="GPU model")
    part = forms.ChoiceField(
        required=False,
        label="Whole or part",
        help_text="whole GPUs, one MIG instance, or a share of a shared GPU (one GPU's part: GPUs must be 1)",
    )
    cpus = forms.FloatField(initial=conf.DEFAULT_CPUS, label="CPUs", help_text="CPU cores for the container")
    memory_mib = forms.IntegerField(
        initial=conf.DEFAULT_MEMORY_MIB, label="Memory (MiB)", help_text="host memory for the container, in MiB"
    )
    max_duration_s = forms.IntegerField(
        initial=conf.DEFAULT_MAX_DURATION_S,
        label="Max duration (s)",
        help_text="the job is stopped after this many seconds of running",
    )
    priority = forms.IntegerField(initial=0, help_text="higher runs first among your team's queued jobs")
    reservation = forms.TypedChoiceField(
        coerce=int,
        empty_value=None,
        required=False,
        help_text="run on the GPUs of one of the team's reservations, or leave empty for any free GPU",
    )

    def __init__(
        self,
        *args: Any,
        teams: list[Any],
        images: list[str],
        models: list[str],
        reservations: list[Reservation] | None = None,
        parts: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        # Which models give each part: the page keeps the model and the part consistent (job_submit.js).
        self.part_models: dict[str, list[str]] = {p["value"]: list(p.get("models", [])) for p in parts or []}
        now = timezone.now()
        by_team: dict[str, list[tuple[int, str]]] = {}
        for r in reservations or []:
            by_team.setdefault(r.team.slug, []).append((r.pk, reservation_label(r, now=now)))
        choices: dict[str, list[Any]] = {
            "team": [(t.slug, f"{t.slug} — {t.name}") for t in teams],
            "image": [(name, name) for name in images],
            "gpu_model": [("", "any model"), *[(m, m) for m in models]],
            # The parts the fleet is laid out in (booking's `bookable_parts`): "mig:<profile>" or "share:<fraction>".
            "part": [("", "whole GPUs"), *[(p["value"], p["label"]) for p in parts or []]],
            # Grouped by team: the job runs in a reservation of the team it is submitted for.
            "reservation": [("", "none: any free GPU"), *[(slug, rows) for slug, rows in sorted(by_team.items())]],
        }
        for name, options in choices.items():
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = options

    def clean_part(self) -> dict[str, str]:
        """The part as job_submit's keywords: {} (whole GPUs), {"mig_profile": ...} or {"gpu_share": ...}."""
        kind, _, value = (self.cleaned_data.get("part") or "").partition(":")
        if kind == "mig":
            return {"mig_profile": value}
        if kind == "share":
            return {"gpu_share": value}
        return {}

    def clean_command(self) -> list[str]:
        return [line.rstrip("\r") for line in self.cleaned_data["command"].split("\n") if line.strip()]

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for raw in (self.cleaned_data.get("env") or "").splitlines():
            if not raw.strip():
                continue
            name, sep, value = raw.partition("=")
            if not sep:
                raise forms.ValidationError(f"{raw!r} is not NAME=value.")
            env[name.strip()] = value
        return env

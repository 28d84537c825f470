"""The submit form of the jobs page: argv one argument per line, env one NAME=value per line."""

from __future__ import annotations

from typing import Any

from django import forms

from apps.jobs import conf


class JobForm(forms.Form):
    team = forms.ChoiceField()
    name = forms.CharField(max_length=200, required=False)
    image = forms.ChoiceField()
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "python\ntrain.py\n--epochs=3"}),
        help_text="one argument per line (argv; no shell)",
    )
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "NAME=value"}), required=False, help_text="NAME=value"
    )
    gpu_count = forms.IntegerField(min_value=1, initial=1)
    gpu_model = forms.ChoiceField(required=False)
    cpus = forms.FloatField(initial=conf.DEFAULT_CPUS)
    memory_mib = forms.IntegerField(initial=conf.DEFAULT_MEMORY_MIB)
    max_duration_s = forms.IntegerField(initial=conf.DEFAULT_MAX_DURATION_S, label="Max duration (s)")
    priority = forms.IntegerField(initial=0)
    reservation = forms.IntegerField(required=False, help_text="run inside this reservation of the team")

    def __init__(self, *args: Any, teams: list[Any], images: list[str], models: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices: dict[str, list[tuple[str, str]]] = {
            "team": [(t.slug, f"{t.slug} — {t.name}") for t in teams],
            "image": [(name, name) for name in images],
            "gpu_model": [("", "any model"), *[(m, m) for m in models]],
        }
        for name, options in choices.items():
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = options

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

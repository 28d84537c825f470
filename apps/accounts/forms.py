from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm

from apps.accounts import ratelimit
from apps.accounts.models import Scope


class RateLimitedLoginForm(AuthenticationForm):
    """Django's login form, refusing further attempts once a username or an IP has failed too often."""

    def clean(self) -> dict[str, object]:
        username = self.data.get("username", "") or ""
        ip = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        if ratelimit.is_locked(str(username), ip):
            raise forms.ValidationError(
                "Too many failed sign-in attempts. Wait a few minutes and try again.", code="rate_limited"
            )
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            ratelimit.record_failure(str(username), ip)
            raise
        ratelimit.clear(str(username), ip)
        return cleaned


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(choices=Scope.choices, widget=forms.CheckboxSelectMultiple)
    expires_days = forms.IntegerField(min_value=1, max_value=settings.TOKEN_MAX_EXPIRY_DAYS, initial=90)

    def __init__(self, *args: Any, staff: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not staff:  # a scope the user can never hold is not offered (the service refuses it anyway)
            field = self.fields["scopes"]
            assert isinstance(field, forms.MultipleChoiceField)
            field.choices = [c for c in Scope.choices if c[0] != Scope.ADMIN]

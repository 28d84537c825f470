"""Pages: sign in/out, and the settings page where people manage their API tokens."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts import selectors, services
from apps.accounts.forms import RateLimitedLoginForm, TokenForm
from apps.accounts.types import signed_in
from apps.core.errors import ApplicationError
from apps.identity.selectors import unix_account_of


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    authentication_form = RateLimitedLoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        # The single sign-on button shows when a provider is configured (apps/identity); the form stays for local
        # and LDAP accounts.
        context["oidc_provider"] = settings.OIDC_PROVIDER_NAME if settings.OIDC_ISSUER_URL else None
        return context


@login_required
def settings_page(request: HttpRequest) -> HttpResponse:
    new_token: str | None = None
    staff = signed_in(request.user).is_staff
    form = TokenForm(request.POST or None, staff=staff)
    if request.method == "POST" and form.is_valid():
        try:
            _, new_token = services.token_create(
                user=signed_in(request.user),
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                expires_days=form.cleaned_data["expires_days"],
            )
            form = TokenForm(staff=staff)
        except ApplicationError as exc:
            form.add_error(None, exc.detail)
    return render(
        request,
        "accounts/settings.html",
        {
            "form": form,
            "new_token": new_token,
            "tokens": selectors.tokens_of(user=request.user),
            "memberships": selectors.memberships_of(user=request.user),
            "retention_days": settings.TOKEN_RETENTION_DAYS,
            "unix_account": unix_account_of(request.user),
        },
    )


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        services.token_revoke(user=signed_in(request.user), token_id=token_id)
        messages.success(request, "Token revoked.")
    except ApplicationError as exc:
        messages.error(request, exc.detail)
    return redirect("accounts:settings")

"""Pages: a team's webhooks (managers and admins) with each endpoint's delivery log, and your mail preferences."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.accounts.models import Team
from apps.accounts.scoping import managed_team_ids_of
from apps.accounts.types import User, signed_in
from apps.core.errors import ApplicationError
from apps.events import selectors, services
from apps.events.forms import ALL_TEAMS, MailPreferenceForm, WebhookForm
from apps.events.models import WebhookEndpoint


def _team_choices(user: User) -> list[tuple[str, str]]:
    teams = Team.objects.all() if user.is_staff else Team.objects.filter(pk__in=managed_team_ids_of(user))
    choices = [(t.slug, f"{t.slug} — {t.name}") for t in teams.order_by("slug")]
    return [(ALL_TEAMS, "Every team"), *choices] if user.is_staff else choices


@login_required
def webhooks(request: HttpRequest) -> HttpResponse:
    user = signed_in(request.user)
    teams = _team_choices(user)
    form = WebhookForm(request.POST or None, teams=teams)
    new_secret: str | None = None
    created: WebhookEndpoint | None = None
    if request.method == "POST" and form.is_valid():
        team = form.cleaned_data["team"]
        try:
            created, new_secret = services.webhook_create(
                user=user,
                team_slug=None if team == ALL_TEAMS else team,
                url=form.cleaned_data["url"],
                events=form.cleaned_data["events"],
            )
            form = WebhookForm(teams=teams)
        except ApplicationError as exc:
            for field, errors in exc.fields.items():
                form.add_error(field if field in form.fields else None, errors)
            if not exc.fields:
                form.add_error(None, exc.detail)
    return render(
        request,
        "events/webhooks.html",
        {
            "form": form,
            "may_register": bool(teams),
            "endpoints": selectors.webhooks_visible_to(user=user),
            "new_secret": new_secret,
            "created": created,
            "nav_section": "accounts",
        },
    )


def _visible(request: HttpRequest, endpoint_id: int) -> WebhookEndpoint:
    endpoint = selectors.webhook_get(user=request.user, endpoint_id=endpoint_id)
    if endpoint is None:
        raise Http404("No such webhook.")
    return endpoint


def _detail(request: HttpRequest, endpoint: WebhookEndpoint, new_secret: str | None = None) -> HttpResponse:
    hours = selectors.delivery_hours(endpoint=endpoint)
    peak = max([int(str(h["succeeded"])) + int(str(h["failed"])) for h in hours] + [1])
    bars = []
    for i, h in enumerate(hours):
        ok_h = 100 * int(str(h["succeeded"])) // peak
        bad_h = 100 * int(str(h["failed"])) // peak
        bars.append({**h, "x": i * 20, "ok_h": ok_h, "ok_y": 110 - ok_h, "bad_h": bad_h, "bad_y": 110 - ok_h - bad_h})
    return render(
        request,
        "events/webhook_detail.html",
        {
            "endpoint": endpoint,
            "deliveries": selectors.deliveries_of(endpoint=endpoint)[:200],
            "bars": bars,
            "peak": peak,
            "new_secret": new_secret,
            "nav_section": "accounts",
        },
    )


@login_required
def webhook_detail(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    return _detail(request, _visible(request, endpoint_id))


@login_required
@require_POST
def webhook_rotate(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    _visible(request, endpoint_id)
    endpoint, secret = services.webhook_rotate_secret(user=signed_in(request.user), endpoint_id=endpoint_id)
    return _detail(request, endpoint, secret)


@login_required
@require_POST
def webhook_delete(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    _visible(request, endpoint_id)
    services.webhook_delete(user=signed_in(request.user), endpoint_id=endpoint_id)
    messages.success(request, "Webhook deleted.")
    return redirect("events:webhooks")


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    user = signed_in(request.user)
    form = MailPreferenceForm(request.POST or None, instance=selectors.mail_preference_of(user=user))
    if request.method == "POST" and form.is_valid():
        services.mail_preference_update(
            user=user, changes={name: bool(form.cleaned_data[name]) for name in MailPreferenceForm.Meta.fields}
        )
        messages.success(request, "Mail preferences saved.")
        return redirect("events:notifications")
    return render(
        request,
        "events/notifications.html",
        {"form": form, "email": user.email, "nav_section": "accounts"},
    )

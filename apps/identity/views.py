"""Pages of the OIDC sign-in: the redirect to the provider and its callback, with a clear page when it fails; and
the sign-out, which ends the provider's session too for a person who signed in there."""

from __future__ import annotations

import logging
import re
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from apps.core.errors import ApplicationError
from apps.identity.oidc import OIDCConfigurationError, discovery, oidc_setting, provider_sign_out_url

logger = logging.getLogger(__name__)
_OAUTH_ERROR_CODE = re.compile(r"[a-z_]{1,64}")
ID_TOKEN_SESSION_KEY = "oidc_id_token"  # noqa: S105 (a session key name: mozilla-django-oidc keeps the token there)


def sign_in_failed(request: HttpRequest, reason: str, *, status: int = 400) -> HttpResponse:
    return render(
        request,
        "identity/sign_in_failed.html",
        {"reason": reason, "provider": settings.OIDC_PROVIDER_NAME},
        status=status,
    )


class OIDCStartView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """Redirects the browser to the provider's authorization endpoint (from the discovery document)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The library reads the endpoint here; the discovery document is read in get(), where a failure can be
        # answered with a page instead of an error while building the view.
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery().authorization_endpoint
        except OIDCConfigurationError as exc:
            logger.warning("oidc sign-in unavailable: %s", exc)
            return sign_in_failed(request, str(exc), status=503)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_CLIENT_ID
        response: HttpResponse = super().get(request)
        return response


class OIDCCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """The provider sends the browser back here with a code; the backend (apps/identity/oidc.py) does the rest.

    Every way this can fail ends on a page that says what went wrong, and no account is created: the ID token is
    verified before anyone is looked up or created."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if request.GET.get("error"):
            super().get(request)  # drops the state and signs nobody in
            # Only the error code is shown, and only a well-formed one: anyone can send a browser here with text of
            # their choosing in `error_description`.
            code = request.GET["error"]
            if code == "access_denied":
                return sign_in_failed(request, "The sign-in was declined at the sign-in provider (access_denied).")
            shown = code if _OAUTH_ERROR_CODE.fullmatch(code) else "an error"
            return sign_in_failed(request, f"The sign-in provider answered with {shown}.")
        try:
            response: HttpResponse = super().get(request)
        except SuspiciousOperation as exc:
            logger.warning("oidc sign-in refused: %s", exc)
            return sign_in_failed(request, str(exc))
        except OIDCConfigurationError as exc:
            logger.warning("oidc sign-in unavailable: %s", exc)
            return sign_in_failed(request, str(exc), status=503)
        except ApplicationError as exc:
            return sign_in_failed(request, exc.detail, status=exc.status)
        except requests.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            logger.warning("oidc token request failed: %s", exc)
            if status in (400, 401):
                return sign_in_failed(
                    request,
                    "The sign-in provider did not accept the portal's client credentials or the code "
                    "(check OIDC_CLIENT_ID and OIDC_CLIENT_SECRET).",
                )
            return sign_in_failed(request, "The sign-in provider answered with an error.", status=502)
        except requests.RequestException as exc:
            logger.warning("oidc provider unreachable: %s", exc)
            return sign_in_failed(request, "The sign-in provider could not be reached.", status=502)
        return response

    def login_failure(self) -> HttpResponse:
        return sign_in_failed(self.request, "Sign-in through the provider did not complete. Try again.")


class SignOutView(auth_views.LogoutView):
    """Signs out of the portal; a person who signed in through the OIDC provider is then sent to the provider's
    sign-out (OpenID Connect RP-Initiated Logout 1.0), which returns them to the portal's sign-in page. Without
    that, the next "Sign in with ..." would sign them straight back in with the provider's session, which on a
    shared lab machine is the next person at the keyboard. `OIDC_SIGN_OUT_AT_PROVIDER=false` keeps it local."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        id_token = request.session.get(ID_TOKEN_SESSION_KEY)  # read before the session is flushed
        response: HttpResponse = super().post(request, *args, **kwargs)
        if isinstance(id_token, str) and id_token and settings.OIDC_SIGN_OUT_AT_PROVIDER:
            url = provider_sign_out_url(id_token=id_token, return_to=request.build_absolute_uri(self.get_success_url()))
            if url is not None:
                return HttpResponseRedirect(url)
        return response

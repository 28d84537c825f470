"""The API's content negotiation answers the common Accept headers without parsing them, exactly as DRF would."""

from __future__ import annotations

import pytest
from django.http import Http404
from rest_framework import exceptions, renderers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from apps.core.api.negotiation import ContentNegotiation

ACCEPTS = [
    None,
    "*/*",
    "application/json",
    "application/json; indent=4",
    "text/html",
    "text/html, */*;q=0.1",
    "application/*",
    "text/plain",
    "",
]
RENDERER_SETS = [
    [renderers.JSONRenderer()],
    [renderers.JSONRenderer(), renderers.BrowsableAPIRenderer()],
    [renderers.BrowsableAPIRenderer(), renderers.JSONRenderer()],
    [renderers.TemplateHTMLRenderer(), renderers.JSONRenderer()],
]


def _request(accept: str | None, query: str = "") -> Request:
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    return Request(APIRequestFactory().get(f"/api/v1/jobs/{query}", **headers))


def _answer(negotiation: DefaultContentNegotiation, request: Request, choices: list, suffix: str | None) -> object:
    try:
        renderer, media_type = negotiation.select_renderer(request, choices, suffix)
    except exceptions.NotAcceptable as exc:
        return ("406", str(exc.detail))
    except (exceptions.NotFound, Http404):
        return ("404",)
    return (type(renderer), media_type)


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("choices", RENDERER_SETS, ids=lambda c: "+".join(type(r).__name__ for r in c))
@pytest.mark.parametrize(("query", "suffix"), [("", None), ("?format=json", None), ("?format=api", None), ("", "json")])
def test_same_answer_as_drf(accept: str | None, choices: list, query: str, suffix: str | None) -> None:
    ours = _answer(ContentNegotiation(), _request(accept, query), choices, suffix)
    drf = _answer(DefaultContentNegotiation(), _request(accept, query), choices, suffix)
    assert ours == drf


def test_the_api_uses_it(client) -> None:
    from django.conf import settings

    assert settings.REST_FRAMEWORK["DEFAULT_CONTENT_NEGOTIATION_CLASS"].endswith("ContentNegotiation")
    # An Accept the API cannot answer is still refused with 406 (through DRF's own negotiation).
    response = client.get("/api/v1/images/", HTTP_ACCEPT="text/html")
    assert response.status_code == 406
    assert response.json()["code"] == "not_acceptable"

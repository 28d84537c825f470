"""`Idempotency-Key` for POSTs: a retried request gets the first answer, never a second write.

The key is claimed by inserting a row under a unique constraint *before* the work runs (its own autocommit
statement), so two concurrent requests with one key cannot both do the work: the loser sees the row and gets
409 `idempotency_in_progress`, or the stored response once the first has finished. A key reused with a
different body is refused (`idempotency_key_reused`). Server errors release the key so the client can retry.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.errors import Conflict, ValidationFailed
from apps.core.models import IdempotencyRecord

HEADER = "HTTP_IDEMPOTENCY_KEY"
KEY_TTL = timedelta(hours=24)

Handler = Callable[..., Response]


def _fingerprint(request: Request) -> str:
    body = json.dumps(request.data, sort_keys=True, default=str) if request.data is not None else ""
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def idempotent(handler: Handler) -> Handler:
    """Decorate a view method (`def post(self, request, ...)`) to honour Idempotency-Key."""

    @functools.wraps(handler)
    def wrapper(view: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.META.get(HEADER)
        if not key or not request.user.is_authenticated:
            return handler(view, request, *args, **kwargs)
        if len(key) > 255:
            raise ValidationFailed("Idempotency-Key must be at most 255 characters.")
        fingerprint = _fingerprint(request)
        IdempotencyRecord.objects.filter(user=request.user, key=key, created_at__lt=timezone.now() - KEY_TTL).delete()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(
                    user=request.user,
                    key=key,
                    method=request.method or "POST",
                    path=request.path,
                    fingerprint=fingerprint,
                )
        except IntegrityError:
            existing = IdempotencyRecord.objects.filter(user=request.user, key=key).first()
            if existing is None:  # deleted between our insert and read: the first request failed; retry once
                return wrapper(view, request, *args, **kwargs)
            if existing.fingerprint != fingerprint:
                raise Conflict(
                    "This Idempotency-Key was used with a different request.", code="idempotency_key_reused"
                ) from None
            if existing.status_code is None:
                raise Conflict(
                    "A request with this Idempotency-Key is still in progress.", code="idempotency_in_progress"
                ) from None
            response = Response(existing.response_body, status=existing.status_code)
            response["Idempotent-Replayed"] = "true"
            return response

        try:
            response = handler(view, request, *args, **kwargs)
        except Exception as exc:
            from apps.core.errors import ApplicationError

            if isinstance(exc, ApplicationError) and exc.status < 500:
                IdempotencyRecord.objects.filter(pk=record.pk).update(
                    status_code=exc.status, response_body=exc.as_body()
                )
            else:
                IdempotencyRecord.objects.filter(pk=record.pk).delete()
            raise
        if response.status_code >= 500:
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
        else:
            IdempotencyRecord.objects.filter(pk=record.pk).update(
                status_code=response.status_code, response_body=response.data
            )
        return response

    return wrapper

"""`Idempotency-Key` for POSTs: a retried request gets the first answer, never a second write.

The key is claimed by inserting a row under a unique constraint before the work runs, in the same transaction
as the work: two concurrent requests with one key cannot both do the work (the second waits on the claimed row,
then gets the stored answer; `idempotency_in_progress` only where the database cannot make it wait), and a process
killed mid-request leaves neither claim nor work, so the client's retry does it. A key reused with a different
body is refused (`idempotency_key_reused`). Server errors leave no claim either: the client may retry.

Keys live KEY_TTL (24 h): an expired claim met by a new request is dropped and the key claimed afresh, and a
Celery beat task (`core.purge_idempotency_records`) deletes expired rows in batches, so the table holds about a
day of POSTs. (Expiry used to be a DELETE in its own transaction before every keyed request: three round trips
each, and rows whose key was never reused stayed forever.)
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

from apps.core.errors import ApplicationError, Conflict, ValidationFailed
from apps.core.models import IdempotencyRecord

HEADER = "HTTP_IDEMPOTENCY_KEY"
KEY_TTL = timedelta(hours=24)
PURGE_BATCH = 5000

Handler = Callable[..., Response]


def _fingerprint(request: Request) -> str:
    body = json.dumps(request.data, sort_keys=True, default=str) if request.data is not None else ""
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


class _Taken(Exception):
    """Another request holds (or held) this key."""


def _replay(
    view: Any, request: Request, key: str, fingerprint: str, wrapper: Handler, *args: Any, **kwargs: Any
) -> Response:
    existing = IdempotencyRecord.objects.filter(user_id=int(request.user.pk or 0), key=key).first()
    if existing is None:  # deleted between our insert and read: the first request failed; retry once
        return wrapper(view, request, *args, **kwargs)
    if existing.created_at < timezone.now() - KEY_TTL:
        # An expired claim: the key is free again. Deleting by pk and age, so a fresh claim made meanwhile by a
        # concurrent request is never removed; then claim it as a new request would.
        IdempotencyRecord.objects.filter(pk=existing.pk, created_at__lt=timezone.now() - KEY_TTL).delete()
        return wrapper(view, request, *args, **kwargs)
    if existing.fingerprint != fingerprint:
        raise Conflict("This Idempotency-Key was used with a different request.", code="idempotency_key_reused")
    if existing.status_code is None:
        raise Conflict("A request with this Idempotency-Key is still in progress.", code="idempotency_in_progress")
    response = Response(existing.response_body, status=existing.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


def _storable(value: Any) -> Any:
    """`value` with NUL characters replaced (U+FFFD): PostgreSQL's jsonb cannot hold \\u0000, and a refusal may echo
    a client's field name that has one (a stored answer that fails to store would turn a 400 into a 500)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


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
        refusal: ApplicationError | None = None
        try:
            # The claim and the work commit together: a process killed mid-request leaves neither (the retry
            # does the work), never a claim stuck "in progress" or a write without its stored answer. A
            # concurrent request with the same key waits on the claim's row until this one ends.
            with transaction.atomic():
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
                    raise _Taken from None
                try:
                    with transaction.atomic():
                        response = handler(view, request, *args, **kwargs)
                except ApplicationError as exc:
                    if exc.status >= 500:
                        raise
                    # The work was rolled back (its savepoint); the refusal is the stored answer.
                    IdempotencyRecord.objects.filter(pk=record.pk).update(
                        status_code=exc.status, response_body=_storable(exc.as_body())
                    )
                    refusal = exc
                else:
                    if response.status_code >= 500:
                        transaction.set_rollback(True)  # nothing kept: the client may retry
                    else:
                        IdempotencyRecord.objects.filter(pk=record.pk).update(
                            status_code=response.status_code, response_body=_storable(response.data)
                        )
        except _Taken:
            return _replay(view, request, key, fingerprint, wrapper, *args, **kwargs)
        if refusal is not None:
            raise refusal
        return response

    wrapper.honours_idempotency_key = True  # type: ignore[attr-defined]  # the OpenAPI schema declares the header
    return wrapper


def idempotency_records_purge(*, now: Any = None, batch: int = PURGE_BATCH) -> int:
    """Delete records older than KEY_TTL, `batch` rows per statement (short locks on a big table). Returns the count."""
    cutoff = (now or timezone.now()) - KEY_TTL
    deleted = 0
    while True:
        ids = list(IdempotencyRecord.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += IdempotencyRecord.objects.filter(pk__in=ids).delete()[0]

"""Prices: each GPU model's price timeline, its list-price fallback, and what a span of GPU time costs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from apps.accounts.types import AnyUser
from apps.billing import costing
from apps.billing.costing import Piece, PricePoint
from apps.billing.models import Price
from apps.billing.selectors.months import ZERO, local_tz
from apps.fleet.models import GpuModel


def price_points(*, gpu_model_ids: Iterable[int] | None = None) -> dict[int, list[PricePoint]]:
    """Each GPU model's price timeline, sorted."""
    qs = Price.objects.all()
    if gpu_model_ids is not None:
        qs = qs.filter(gpu_model_id__in=list(gpu_model_ids))
    out: dict[int, list[PricePoint]] = defaultdict(list)
    for model_id, valid_from, price in qs.order_by("gpu_model_id", "valid_from").values_list(
        "gpu_model_id", "valid_from", "hourly_price"
    ):
        out[model_id].append(PricePoint(valid_from, price))
    return {k: costing.normalize_prices(v) for k, v in out.items()}


def list_prices(*, gpu_model_ids: Iterable[int] | None = None) -> dict[int, Decimal]:
    """The fleet's list prices (GpuModel.hourly_price): what applies before a model's first Price row."""
    qs = GpuModel.objects.all()
    if gpu_model_ids is not None:
        qs = qs.filter(pk__in=list(gpu_model_ids))
    return dict(qs.values_list("pk", "hourly_price"))


@dataclass(frozen=True)
class PriceBook:
    """Price timelines and fallbacks of some GPU models, loaded once for a batch of computations."""

    points: dict[int, list[PricePoint]]
    fallbacks: dict[int, Decimal]

    def split(self, gpu_model_id: int, start: datetime, end: datetime) -> list[Piece]:
        return costing.split(
            start,
            end,
            prices=self.points.get(gpu_model_id, []),
            tz=local_tz(),
            fallback_price=self.fallbacks.get(gpu_model_id, ZERO),
        )

    def price_at(self, gpu_model_id: int, at: datetime) -> Decimal:
        price = costing.price_at(self.points.get(gpu_model_id, []), at, self.fallbacks.get(gpu_model_id, ZERO))
        return price if price is not None else ZERO


def price_book(*, gpu_model_ids: Iterable[int] | None = None) -> PriceBook:
    ids = None if gpu_model_ids is None else set(gpu_model_ids)
    return PriceBook(points=price_points(gpu_model_ids=ids), fallbacks=list_prices(gpu_model_ids=ids))


def price_at(*, gpu_model_id: int, at: datetime | None = None) -> Decimal:
    """The hourly price of a GPU model at `at` (default now)."""
    return price_book(gpu_model_ids=[gpu_model_id]).price_at(gpu_model_id, at or timezone.now())


def estimate_cost(*, gpu_model_id: int, start: datetime, end: datetime, gpu_count: int = 1) -> Decimal:
    """What holding `gpu_count` GPUs of a model over [start, end) will cost, across price changes and months.
    For quota checks of new bookings and jobs (apps.booking)."""
    book = price_book(gpu_model_ids=[gpu_model_id])
    return sum((p.cost for p in book.split(gpu_model_id, start, end)), ZERO) * gpu_count


def prices_visible_to(*, user: AnyUser) -> QuerySet[Price]:
    return Price.objects.visible_to(user).select_related("gpu_model").order_by("gpu_model__name", "valid_from")

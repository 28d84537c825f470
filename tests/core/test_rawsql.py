"""apps.core.rawsql's hand-written reads and writes give what the ORM gives (both databases: CI runs PostgreSQL,
a plain `pytest` SQLite, whose datetimes are text that must be stored in the ORM's format to compare)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.core import rawsql
from apps.jobs.models import Job, JobEvent


def _job(team: Any, user: Any, **fields: Any) -> Job:
    values: dict[str, Any] = {
        "team": team,
        "user": user,
        "image": "local/test",
        "command": ["python", "-c", "print('ü')"],
        "env": {"A": "1", "QUOTE": 'it\'s "x"'},
        "mounts": [{"source": "/data", "target": "/data", "read_only": True}],
        "gpu_count": 2,
        "gpu_models": ["A100-80GB", "H100-80GB"],
        "cpus": Decimal("1.50"),
        "memory_mib": 2048,
        "max_duration_s": 600,
    }
    values.update(fields)
    return Job(**values)


@pytest.mark.django_db
def test_insert_writes_what_the_orm_reads_back_and_sets_the_key(alice: Any, vision: Any) -> None:
    before = timezone.now()
    job = _job(vision, alice, idempotency_key="k-1")

    rawsql.insert([job])

    assert job.pk is not None and not job._state.adding
    stored = Job.objects.get(pk=job.pk)
    assert stored.command == ["python", "-c", "print('ü')"]
    assert stored.env == {"A": "1", "QUOTE": 'it\'s "x"'}
    assert stored.mounts == [{"source": "/data", "target": "/data", "read_only": True}]
    assert stored.gpu_models == ["A100-80GB", "H100-80GB"]
    assert stored.cpus == Decimal("1.50")
    assert (stored.team_id, stored.user_id, stored.state, stored.idempotency_key) == (
        vision.pk,
        alice.pk,
        "queued",
        "k-1",
    )
    # auto_now_add / auto_now were applied, and the stored text compares as the ORM's own values do
    assert before <= stored.submitted_at <= timezone.now()
    assert Job.objects.filter(pk=job.pk, submitted_at=job.submitted_at, submitted_at__gte=before).exists()


@pytest.mark.django_db
def test_insert_many_rows_in_one_statement_keeps_their_order(alice: Any, vision: Any) -> None:
    job = _job(vision, alice)
    rawsql.insert([job])
    now = timezone.now()
    events = [
        JobEvent(job=job, at=now + timedelta(seconds=i), from_state="queued", to_state="starting", message=f"m{i}")
        for i in range(5)
    ]

    rawsql.insert(events)

    assert len({e.pk for e in events}) == 5
    stored = list(JobEvent.objects.filter(job=job).order_by("id").values_list("id", "message", "at"))
    assert [(e.pk, e.message, e.at) for e in events] == stored
    rawsql.insert([])  # nothing to do is not an error


@pytest.mark.django_db
def test_insert_of_a_duplicate_is_an_integrity_error_and_leaves_nothing(alice: Any, vision: Any) -> None:
    rawsql.insert([_job(vision, alice, idempotency_key="same")])

    with pytest.raises(IntegrityError), transaction.atomic():
        rawsql.insert([_job(vision, alice, idempotency_key="other")])
        rawsql.insert([_job(vision, alice, idempotency_key="same")])

    assert sorted(Job.objects.values_list("idempotency_key", flat=True)) == ["same"]


@pytest.mark.django_db
def test_insert_with_child_writes_both_rows_linked_in_one_statement_on_postgresql(alice: Any, vision: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = _job(vision, alice, idempotency_key="pair")
    at = timezone.now()
    event = JobEvent(at=at, from_state="", to_state="queued", message="ü 'quoted' \"x\"")

    with CaptureQueriesContext(connection) as queries:
        rawsql.insert_with_child(job, event, "job_id")

    assert len(queries.captured_queries) == (1 if connection.vendor == "postgresql" else 2)
    assert job.pk is not None and event.pk is not None and event.job_id == job.pk
    assert not job._state.adding and not event._state.adding
    stored = Job.objects.get(pk=job.pk)
    assert stored.env == {"A": "1", "QUOTE": 'it\'s "x"'} and stored.cpus == Decimal("1.50")
    assert stored.idempotency_key == "pair" and stored.submitted_at == job.submitted_at
    assert list(JobEvent.objects.filter(job=job).values_list("id", "at", "from_state", "to_state", "message")) == [
        (event.pk, at, "", "queued", "ü 'quoted' \"x\"")
    ]


@pytest.mark.django_db
def test_insert_with_child_of_a_duplicate_parent_writes_neither(alice: Any, vision: Any) -> None:
    rawsql.insert([_job(vision, alice, idempotency_key="same")])

    with pytest.raises(IntegrityError), transaction.atomic():
        rawsql.insert_with_child(
            _job(vision, alice, idempotency_key="same"), JobEvent(at=timezone.now(), to_state="queued"), "job_id"
        )

    assert Job.objects.count() == 1 and not JobEvent.objects.exists()


@pytest.mark.django_db
def test_update_by_key_and_condition_counts_the_rows_it_changed(alice: Any, vision: Any) -> None:
    from apps.fleet.models import Node

    node = Node.objects.create(name="raw-node")
    first, second = _job(vision, alice), _job(vision, alice)
    rawsql.insert([first, second])
    at = timezone.now().replace(microsecond=123456)

    changed = rawsql.update(
        Job, {"id": first.pk, "state": "queued"}, {"state": "starting", "node": node, "scheduled_at": at}
    )
    refused = rawsql.update(Job, {"id": second.pk, "state": "running"}, {"state": "succeeded"})

    assert (changed, refused) == (1, 0)
    stored = Job.objects.get(pk=first.pk)
    assert (stored.state, stored.node_id, stored.scheduled_at) == ("starting", node.pk, at)
    assert Job.objects.filter(scheduled_at=at).count() == 1  # stored in the ORM's format (SQLite text)
    assert Job.objects.get(pk=second.pk).state == "queued"


@pytest.mark.django_db
def test_update_in_a_list_of_keys_with_attname_and_decimal_values(alice: Any, vision: Any) -> None:
    from apps.fleet.models import Node

    node = Node.objects.create(name="raw-node-2")
    jobs = [_job(vision, alice) for _ in range(3)]
    rawsql.insert(jobs)

    changed = rawsql.update(
        Job, {"id": [jobs[0].pk, jobs[2].pk]}, {"node_id": node.pk, "hourly_price": Decimal("12.3456")}
    )

    assert changed == 2
    assert rawsql.update(Job, {"id": []}, {"state": "failed"}) == 0
    prices = dict(Job.objects.values_list("pk", "hourly_price"))
    assert prices == {jobs[0].pk: Decimal("12.3456"), jobs[1].pk: Decimal("0"), jobs[2].pk: Decimal("12.3456")}
    assert set(Job.objects.filter(node=node).values_list("pk", flat=True)) == {jobs[0].pk, jobs[2].pk}


@pytest.mark.django_db
def test_field_converter_turns_a_selected_datetime_into_the_orms_value(alice: Any, vision: Any) -> None:
    job = _job(vision, alice)
    rawsql.insert([job])
    row = rawsql.fetch_one(f"SELECT submitted_at FROM {Job._meta.db_table} WHERE id = %s", [job.pk])  # noqa: S608
    assert row is not None
    convert = rawsql.field_converter(Job, "submitted_at")
    value = convert(row[0]) if convert is not None else row[0]
    assert value == Job.objects.get(pk=job.pk).submitted_at
    param = rawsql.datetime_param(value)
    assert rawsql.fetch_one(f"SELECT id FROM {Job._meta.db_table} WHERE submitted_at = %s", [param]) == (job.pk,)  # noqa: S608

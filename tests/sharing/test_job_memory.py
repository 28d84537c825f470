"""Each job's own GPU memory (the agent's `"j"` list): through ingest into Redis, on the Fleet snapshot for a
share, into the job's stored peak every minute, and behind the job's memory guidance against its part's memory.
A node reports only for its own GPUs, and a reading for a job that is not on that GPU is never used."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.services import reservation_create
from apps.core.redis import get_redis
from apps.efficiency.jobinfo import job_efficiency
from apps.fleet import services as fleet_services
from apps.fleet.messages import MAX_JOBS_PER_GPU, check_row
from apps.jobs.models import Job
from apps.jobs.services import job_report_started
from apps.telemetry import keys
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.jobmem import FORGET_AFTER_S, flush_job_memory, job_memory
from apps.telemetry.models import JobMemoryMinute
from apps.telemetry.publisher import FleetPublisher
from apps.telemetry.rollups import flush_rollups
from tests.fleet.util import row, telemetry
from tests.sharing.test_jobs import one_pass, submit

pytestmark = pytest.mark.django_db(transaction=True)  # the publisher closes stale connections, as its process does


def _started(alice: Any, vision: Any, **fields: Any) -> Job:
    job = submit(alice, vision, **fields)
    assert job.pk in one_pass().started
    job.refresh_from_db()
    assert job.node is not None
    job_report_started(node_id=job.node.pk, job_id=job.pk, handle="pid:4242", at=timezone.now())
    job.refresh_from_db()
    return job


def _report(node: str, uuid: str, jobs: list[list[int]], *, ts: float | None = None) -> None:
    _, token = fleet_services.node_token_issue(node_name=node)
    result = telemetry_ingest(telemetry(node, token, [row(uuid, mem=30_000, extra={"j": jobs})], ts=ts))
    assert result.accepted == 1


def test_a_row_keeps_good_job_readings_and_drops_bad_ones_alone():
    entries = [[7, 5_000], [8, -1], [0, 10], [True, 10], ["9", 10], [10, 90_000], [11, 1.5], [12], "x", [13, 0]]
    parsed = check_row(row("GPU-x", mem_total=81_920, extra={"j": entries}))
    assert parsed.job_memory == {7: 5_000, 13: 0} and parsed.util == 50
    assert check_row(row("GPU-x", extra={"j": {"7": 1}})).job_memory == {}
    many = [[i, 1] for i in range(1, MAX_JOBS_PER_GPU + 10)]
    assert len(check_row(row("GPU-x", extra={"j": many})).job_memory) == MAX_JOBS_PER_GPU


def test_a_shares_job_has_its_own_reading_and_peak(alice, vision, ready, sent, api_as):
    quarter = _started(alice, vision, gpu_share=0.25)
    whole = _started(alice, vision)  # on an exclusive GPU, not on GPU-shared-0
    _report("shared", "GPU-shared-0", [[quarter.pk, 15_000], [whole.pk, 999]])
    _report("shared", "GPU-shared-0", [[quarter.pk, 9_000]])
    assert job_memory(quarter) == job_memory(Job.objects.get(pk=quarter.pk))
    mem = job_memory(quarter)
    assert (mem.used_mib, mem.peak_mib) == (9_000, 15_000)
    assert job_memory(whole).peak_mib is None  # the shared node's word about a job on another GPU is not used

    # The Fleet snapshot: the share's holder with what its job uses, against the share's memory.
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    (holder,) = shared["holder"]
    assert (holder["part"], holder["mem"], holder["used"]) == ("share 1/4", 20_480, 9_000)
    assert shared["parts"]["used"] == {holder["part_uuid"]: 9_000}

    # A minute's flush keeps the peak in the database; the stray reading is dropped from Redis at once.
    assert flush_job_memory() == 1
    assert Job.objects.get(pk=quarter.pk).gpu_memory_own_peak_mib == 15_000
    assert Job.objects.get(pk=whole.pk).gpu_memory_own_peak_mib is None
    left = get_redis().hgetall(keys.JOB_MEMORY)
    assert {f.decode() for f in left} == {f"{quarter.pk}|GPU-shared-0"}

    # A lower peak later never lowers the stored one; a reading not heard from for a while is forgotten.
    get_redis().delete(keys.JOB_MEMORY)
    _report("shared", "GPU-shared-0", [[quarter.pk, 4_000]])
    flush_job_memory()
    assert Job.objects.get(pk=quarter.pk).gpu_memory_own_peak_mib == 15_000
    assert job_memory(Job.objects.get(pk=quarter.pk)).peak_mib == 15_000
    flush_job_memory(now=time.time() + FORGET_AFTER_S + 1)
    assert get_redis().hlen(keys.JOB_MEMORY) == 0
    later = job_memory(Job.objects.get(pk=quarter.pk), now=time.time() + 60)
    assert (later.used_mib, later.peak_mib) == (None, 15_000)  # no fresh reading: nothing "now", the peak stays


def test_a_share_held_by_a_reservation_shows_the_job_running_inside_it(alice, vision, ready, sent):
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    booked = reservation_create(user=alice, team=vision, start=start, end=start + timedelta(hours=1), gpu_share="0.25")
    inside = _started(alice, vision, reservation_id=booked.reservation.pk)
    _report("shared", "GPU-shared-0", [[inside.pk, 7_000]])
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    (holder,) = shared["holder"]
    assert (holder["kind"], holder["used"]) == ("reservation", 7_000)
    flush_job_memory()
    assert Job.objects.get(pk=inside.pk).gpu_memory_own_peak_mib == 7_000


def test_the_only_reservation_on_a_gpu_shows_what_no_jobs_processes_use(alice, bob, vision, ready, sent):
    """A reservation's holder works from a shell or a notebook, not through portal jobs: where it is the GPU's only
    reservation, its share shows what the processes of no job use there (the agent's "o"), live; with a second
    reservation on the GPU, whose processes are whose cannot be told, and neither shows it."""
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    mine = reservation_create(user=alice, team=vision, start=start, end=start + timedelta(hours=1), gpu_share="0.25")
    neighbour = _started(alice, vision, gpu_share=0.25)
    _, token = fleet_services.node_token_issue(node_name="shared")
    extra = {"j": [[neighbour.pk, 9_000, 80]], "o": [5_000, 30]}
    assert telemetry_ingest(telemetry("shared", token, [row("GPU-shared-0", mem=30_000, extra=extra)])).accepted == 1
    flush_job_memory()  # the minute's flush keeps the reading (it is no job's, and fresh)
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    by_kind = {h["kind"]: h for h in shared["holder"]}
    assert by_kind["reservation"]["used"] == 5_000 and by_kind["job"]["used"] == 9_000
    share_of = {h["kind"]: h["part_uuid"] for h in shared["holder"]}
    assert shared["parts"]["busy"] == {share_of["reservation"]: 30, share_of["job"]: 80}
    theirs = reservation_create(user=bob, team=bob.memberships.first().team, start=start,
                                end=start + timedelta(hours=1), gpu_share="0.25")  # fmt: skip
    assert theirs.reservation.pk
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    assert [h["used"] for h in shared["holder"] if h["kind"] == "reservation"] == [None, None]
    assert mine.reservation.pk


def test_two_reservations_on_a_gpu_each_show_their_own_work(alice, bob, vision, ready, sent):
    """With their holders' uids known (apps.identity.models.UnixAccount), two reservations of one GPU each show
    what the processes of no job use there less the other's: the agent's "o" and its per-owner "ou", live. An
    owner missing from the latest listing ran nothing then; a third holder whose uid is not known makes the
    others' parts unknown again."""
    from apps.identity.models import UnixAccount
    from apps.telemetry.jobmem import owner_readings

    UnixAccount.objects.create(user=alice, uid=1001)
    UnixAccount.objects.create(user=bob, uid=1002)
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    window = {"start": start, "end": start + timedelta(hours=1), "gpu_share": "0.25"}
    mine = reservation_create(user=alice, team=vision, **window).reservation
    theirs = reservation_create(user=bob, team=bob.memberships.first().team, **window).reservation
    _, token = fleet_services.node_token_issue(node_name="shared")

    def send(extra: dict[str, Any], ts: float) -> dict[int, tuple[Any, Any]]:
        message = telemetry("shared", token, [row("GPU-shared-0", mem=30_000, extra=extra)], ts=ts)
        assert telemetry_ingest(message).accepted == 1
        shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
        busy = shared["parts"].get("busy", {})
        return {h["id"]: (h["used"], busy.get(h["part_uuid"])) for h in shared["holder"]}

    ts = time.time()
    seen = send({"o": [5_000, 30], "ou": [[1001, 4_000, 30], [1002, 1_000, 0]]}, ts - 10)
    assert seen == {mine.pk: (4_000, 30), theirs.pk: (1_000, 0)}
    # Bob's process ended: he is missing from the next listing, and his last reading is not taken from Alice's.
    seen = send({"o": [4_000, 25], "ou": [[1001, 4_000, 25]]}, ts)
    assert seen == {mine.pk: (4_000, 25), theirs.pk: (0, 0)}
    assert (1002, "GPU-shared-0") in owner_readings([(1002, "GPU-shared-0")])
    flush_job_memory(now=ts + FORGET_AFTER_S + 1)  # readings not reported for a while are forgotten
    assert owner_readings([(1001, "GPU-shared-0"), (1002, "GPU-shared-0")]) == {}
    carol = type(alice).objects.create_user("carol-shares")
    vision.memberships.create(user=carol)
    reservation_create(user=carol, team=vision, **window)
    seen = send({"o": [4_000, 25], "ou": [[1001, 4_000, 25]]}, time.time())
    assert seen[mine.pk] == (None, None) and seen[theirs.pk] == (None, None)


def test_a_job_on_two_shares_is_one_holder_read_against_both(alice, vision, ready, sent):
    half = _started(alice, vision, gpu_share=0.5)
    _report("shared", "GPU-shared-0", [[half.pk, 30_000]])  # above one share's 20 GiB, within the half's 40 GiB
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    (holder,) = shared["holder"]
    assert (holder["kind"], holder["id"], holder["part"]) == ("job", half.pk, "shares 1-2/4")
    assert (holder["mem"], holder["used"]) == (40_960, 30_000)
    assert shared["parts"]["free"] == 2
    # A quarter job beside it is a holder of its own.
    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[half.pk, 31_000], [quarter.pk, 5_000]])
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    by_job = {h["id"]: (h["part"], h["mem"], h["used"]) for h in shared["holder"]}
    assert by_job == {half.pk: ("shares 1-2/4", 40_960, 31_000), quarter.pk: ("share 3/4", 20_480, 5_000)}


def test_a_whole_gpu_job_on_a_shared_gpu_is_one_holder_of_all_its_shares(alice, vision, ready, sent):
    from apps.fleet.models import Gpu, GpuStatus

    Gpu.objects.filter(uuid__in=["GPU-mig-1", "GPU-shared-1"]).update(status=GpuStatus.LOST)  # only the split one
    whole = _started(alice, vision)
    _report("shared", "GPU-shared-0", [[whole.pk, 70_000]])  # more than three shares' memory: it has them all
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    (holder,) = shared["holder"]
    assert (holder["kind"], holder["id"], holder["part"]) == ("job", whole.pk, "all 4 shares")
    assert (holder["mem"], holder["used"]) == (81_920, 70_000)
    assert shared["parts"]["free"] == 0


def test_a_stale_reading_is_not_shown_as_now(alice, vision, ready, sent):
    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[quarter.pk, 12_000]])
    later = time.time() + keys.JOB_MEMORY_FRESH_S + 5
    shared = {g["uuid"]: g for g in FleetPublisher().build(now=later)["gpus"]}["GPU-shared-0"]
    assert [h["used"] for h in shared["holder"]] == [None]
    assert job_memory(quarter, now=later).used_mib is None


def test_a_share_jobs_guidance_is_judged_against_its_share(alice, vision, ready, sent, api_as, client):
    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[quarter.pk, 19_500]])  # 95% of the 20 GiB share; 24% of the GPU
    body = api_as(alice).get(f"/api/v1/jobs/{quarter.pk}/").json()
    assert body["gpu_memory_peak_mib"] == 19_500
    # A share is listed as its GPU with the fraction held (what the container is given), as a booking lists it.
    assert body["gpus"] == [
        {"uuid": "GPU-shared-0", "node": "shared", "index": 0, "model": "A100-80GB", "profile": None, "share": 0.25}
    ]
    codes = {a["code"]: a["detail"] for a in body["advice"]}
    assert "amp" in codes and "of 20480 MiB" in codes["amp"]
    assert "input_bound" not in codes  # the utilization is the whole GPU's, not the job's to judge
    assert "over_share" not in codes  # 95% of its budget: within it
    client.force_login(alice)
    page = client.get(f"/jobs/{quarter.pk}/").content.decode()
    assert '<strong id="job-mem-peak">19500 MiB</strong> of 20480 MiB' in page
    assert "On a GPU share: the memory is the job's own" in page and 'data-code="amp"' in page
    assert "<td>shared/0 · share 1/4</td>" in page and 'data-gpus="GPU-shared-0"' in page


def test_a_share_job_far_below_its_budget_is_told_of_an_instance(alice, vision, ready, sent, api_as):
    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[quarter.pk, 3_000]])
    codes = {a["code"]: a["detail"] for a in api_as(alice).get(f"/api/v1/jobs/{quarter.pk}/").json()["advice"]}
    assert "is 15% of its GPU share's 20480 MiB" in codes["smaller_gpu"]
    assert "fits a MIG 1g.10gb instance" in codes["use_mig_profile"]


def test_a_share_job_over_its_budget_is_told_so(alice, vision, ready, sent, api_as):
    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[quarter.pk, 30_000]])  # above the 20 GiB budget: nothing enforces it
    codes = {a["code"]: a["detail"] for a in api_as(alice).get(f"/api/v1/jobs/{quarter.pk}/").json()["advice"]}
    assert "above the share's budget of 20480 MiB (146%)" in codes["over_share"]
    assert "GPUPORTAL_GPU_MEMORY_MIB" in codes["over_share"]


def test_a_job_on_half_a_gpu_is_judged_against_both_shares(alice, vision, ready, sent, api_as, client):
    half = _started(alice, vision, gpu_share=0.5)
    _report("shared", "GPU-shared-0", [[half.pk, 30_000]])  # above one share's 20 GiB, within the half's 40 GiB
    codes = {a["code"] for a in api_as(alice).get(f"/api/v1/jobs/{half.pk}/").json()["advice"]}
    assert "over_share" not in codes
    client.force_login(alice)
    page = client.get(f"/jobs/{half.pk}/").content.decode()
    assert '<strong id="job-mem-peak">30000 MiB</strong> of 40960 MiB' in page


def test_a_part_jobs_memory_is_kept_per_minute_and_charted(alice, vision, ready, sent, client, settings):
    quarter = _started(alice, vision, gpu_share=0.25)
    whole = _started(alice, vision)  # not on this GPU: the shared node's word about it is not kept
    minute = int(time.time()) // 60 * 60 - 120  # two minutes ago: within the accepted age, closed soon after
    settings.TELEMETRY_MAX_AGE_S = 300
    for offset, mib in ((5, 6_000), (25, 9_500), (45, 7_000)):
        _report("shared", "GPU-shared-0", [[quarter.pk, mib], [whole.pk, 1_000]], ts=minute + offset)
    _report("shared", "GPU-shared-0", [[quarter.pk, 4_000]], ts=minute + 65)
    closing = 60 + 300 + 5  # a minute is flushed once no accepted sample can still fall into it
    flush_rollups(now=minute + closing + 1)  # the first minute only
    (row_,) = JobMemoryMinute.objects.all()
    assert (row_.job_id, row_.gpu.uuid, row_.mem_used_max) == (quarter.pk, "GPU-shared-0", 9_500)
    flush_rollups(now=minute + 60 + closing + 1)
    assert sorted(JobMemoryMinute.objects.values_list("mem_used_max", flat=True)) == [4_000, 9_500]
    flush_rollups(now=minute + 60 + closing + 1)  # again: the same rows, not more
    assert JobMemoryMinute.objects.count() == 2

    # The job has run since before those minutes (it was started "now" above, after the readings' times).
    Job.objects.filter(pk=quarter.pk).update(started_at=datetime.fromtimestamp(minute - 60, tz=UTC))
    eff = job_efficiency(Job.objects.get(pk=quarter.pk))
    assert [p["mem"] for p in eff.series] == [9_500, 4_000]
    assert all(p["util"] == 50.0 for p in eff.series)  # the GPU's utilization, as before
    client.force_login(alice)
    page = client.get(f"/jobs/{quarter.pk}/").content.decode()
    assert 'id="chart-job-gpu"' in page and '"mem": 9500' in page


def test_each_share_jobs_own_sm_activity_is_kept_per_minute(alice, vision, ready, sent, settings):
    """Two jobs on quarters of one GPU, one computing and one only holding memory: each minute keeps each job's
    own SM activity (the "j" entries' third element), and the job page reads the job's, not the GPU's."""
    busy, idle = _started(alice, vision, gpu_share=0.25), _started(alice, vision, gpu_share=0.25)
    minute = int(time.time()) // 60 * 60 - 120
    settings.TELEMETRY_MAX_AGE_S = 300
    for offset, pct in ((5, 90), (25, 70)):
        _report("shared", "GPU-shared-0", [[busy.pk, 6_000, pct], [idle.pk, 3_000, 0]], ts=minute + offset)
    _report("shared", "GPU-shared-0", [[busy.pk, 6_000]], ts=minute + 45)  # a read without the figure
    flush_rollups(now=minute + 60 + 300 + 6)
    rows = {r.job_id: (r.mem_used_max, r.util_mean) for r in JobMemoryMinute.objects.all()}
    assert rows == {busy.pk: (6_000, 80.0), idle.pk: (3_000, 0.0)}
    for job in (busy, idle):
        Job.objects.filter(pk=job.pk).update(started_at=datetime.fromtimestamp(minute - 60, tz=UTC))
    assert job_efficiency(Job.objects.get(pk=busy.pk)).gpu_utilization_mean == 80.0
    eff = job_efficiency(Job.objects.get(pk=idle.pk))
    assert eff.gpu_utilization_mean == 0.0 and [p["util"] for p in eff.series] == [0.0]  # the GPU said 50%


def test_a_share_job_with_nothing_on_the_gpu_is_kept_as_holding_nothing(alice, vision, ready, sent, settings):
    """From the agent's attribution to the minute rows: a job on a quarter with no process on the GPU, beside a
    neighbour computing on its own quarter, reads 0 MiB and 0% (the listing shows everything on the GPU), and its
    minutes say so; before, it had no reading and was judged by its neighbour's work."""
    from workers.gpu.base import GpuSample, sample_to_row
    from workers.jobmem import JobMemory, RunningJob

    busy, empty = _started(alice, vision, gpu_share=0.25), _started(alice, vision, gpu_share=0.25)
    running = [RunningJob(busy.pk, ("GPU-shared-0",), ""), RunningJob(empty.pk, ("GPU-shared-0",), "")]
    attribution = JobMemory(lambda: running, job_of_pid={4242: busy.pk}.get)
    minute = int(time.time()) // 60 * 60 - 120
    settings.TELEMETRY_MAX_AGE_S = 300
    _, token = fleet_services.node_token_issue(node_name="shared")
    for offset in (5, 25):
        reading = GpuSample("GPU-shared-0", minute + offset, 80, 6_400, 81_920, 50, 200.0, 1_400,
                            processes=[(4242, 6_000)], process_util={4242: 80})  # fmt: skip
        (annotated,) = attribution.annotate([reading])
        result = telemetry_ingest(telemetry("shared", token, [sample_to_row(annotated)], ts=minute + offset))
        assert result.accepted == 1
    flush_rollups(now=minute + 60 + 300 + 6)
    rows = {r.job_id: (r.mem_used_max, r.util_mean) for r in JobMemoryMinute.objects.all()}
    assert rows == {busy.pk: (6_000, 80.0), empty.pk: (0, 0.0)}
    assert job_memory(Job.objects.get(pk=empty.pk)).peak_mib == 0


def test_the_fleet_shows_each_share_jobs_sm_activity_now(alice, vision, ready, sent):
    """The live snapshot's `parts.busy` carries each held share's job's SM activity beside the MIG instances'; the
    reading keeps its peak across reports that carry the figure."""
    busy, idle = _started(alice, vision, gpu_share=0.25), _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[busy.pk, 12_000, 95], [idle.pk, 3_000, 0]])
    _report("shared", "GPU-shared-0", [[busy.pk, 8_000, 70], [idle.pk, 3_000]])  # idle's figure unread this time
    reading = job_memory(busy)
    assert (reading.used_mib, reading.peak_mib) == (8_000, 12_000)
    shared = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-shared-0"]
    by_job = {h["id"]: h["part_uuid"] for h in shared["holder"]}
    assert shared["parts"]["busy"] == {by_job[busy.pk]: 70}
    assert shared["parts"]["used"] == {by_job[busy.pk]: 8_000, by_job[idle.pk]: 3_000}
    mig = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}["GPU-mig-0"]
    assert "busy" not in mig["parts"]  # no GPM reading there, and the shares' figures are not its


def test_a_mig_jobs_guidance_names_its_instance(alice, vision, ready, sent, api_as, client):
    mig = _started(alice, vision, mig_profile="1g.10gb")
    _report("mig", "GPU-mig-0", [[mig.pk, 3_000]])  # the agent's reading of the job's instance
    body = api_as(alice).get(f"/api/v1/jobs/{mig.pk}/").json()
    assert body["gpu_memory_peak_mib"] == 3_000
    (device,) = body["gpus"]  # the instance it holds, as a booking lists it
    assert (device["profile"], device["parent"], device["share"], device["node"]) == (
        "1g.10gb",
        "GPU-mig-0",
        0.142857,
        "mig",
    )
    assert device["uuid"].startswith("MIG-")
    client.force_login(alice)
    page = client.get(f"/jobs/{mig.pk}/").content.decode()
    assert f'<tr data-uuid="GPU-mig-0" data-part="{device["uuid"]}" data-kind="mig"><td>mig/0 · 1g.10gb</td>' in page
    # 3,000 MiB of the 9,728 of a 1g.10gb: far below, but no smaller A100 profile exists, so nothing to say.
    assert body["advice"] == []
    flush_job_memory()
    assert Job.objects.get(pk=mig.pk).gpu_memory_own_peak_mib == 3_000


def test_the_cli_status_shows_the_device_the_memory_and_the_advice(alice, vision, ready, sent, api_as, capsys):
    from cli import gpuportal

    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[quarter.pk, 30_000]])
    body = api_as(alice).get(f"/api/v1/jobs/{quarter.pk}/").json()

    class Portal:  # answers with the API's own answer, as the CLI's client would
        def request(self, method: str, path: str, **kwargs: Any) -> Any:
            assert (method, path) == ("GET", f"/jobs/{quarter.pk}/")
            return body

    assert gpuportal.cmd_status(Portal(), argparse.Namespace(job_id=quarter.pk, json=False)) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "  on 0.25 of GPU-shared-0\n" in out
    assert "  GPU memory peak 30000 MiB\n" in out  # no rollups yet: no mean utilization to show
    assert "  advice over_share: Peak GPU memory 30000 MiB is above the share's budget" in out


def test_the_gpu_api_and_cli_list_each_held_share_with_its_jobs_memory(
    alice, vision, ready, sent, api_as, capsys, charlie
):
    from cli import gpuportal

    half = _started(alice, vision, gpu_share=0.5)
    quarter = _started(alice, vision, gpu_share=0.25)
    _report("shared", "GPU-shared-0", [[half.pk, 31_000, 60], [quarter.pk, 5_000]])
    answer = api_as(alice).get("/api/v1/gpus/", {"node": "shared"}).json()
    (shared,) = [g for g in answer["results"] if g["uuid"] == "GPU-shared-0"]
    rows = [
        (s["index"], s["memory_mib"], s["memory_used_mib"], s["sm_active_pct"], (s["holder"] or {}).get("id"))
        for s in shared["share_devices"]
    ]
    # The half's reading is on its first share; the free share has neither reading nor holder; the quarter's node
    # did not read its SM activity.
    assert rows == [
        (0, 20_480, 31_000, 60, half.pk),
        (1, 20_480, None, None, half.pk),
        (2, 20_480, 5_000, None, quarter.pk),
        (3, 20_480, None, None, None),
    ]
    assert shared["shares_free"] == 1
    assert all(g["share_devices"] == [] for g in answer["results"] if g["uuid"] != "GPU-shared-0")
    # Per holder: the half is one row, read against both its shares' memory.
    holders = [
        (
            h["holder"]["id"],
            h["indexes"],
            h["memory_mib"],
            h["memory_used_mib"],
            h["sm_active_pct"],
            len(h["share_uuids"]),
        )
        for h in shared["share_holders"]
    ]
    assert holders == [(half.pk, [0, 1], 40_960, 31_000, 60, 2), (quarter.pk, [2], 20_480, 5_000, None, 1)]
    assert all(g["share_holders"] == [] for g in answer["results"] if g["uuid"] != "GPU-shared-0")
    # Another team sees that the shares are taken and by which team, not by whom or which job.
    other = api_as(charlie).get("/api/v1/gpus/", {"node": "shared"}).json()
    (seen,) = [g for g in other["results"] if g["uuid"] == "GPU-shared-0"]
    assert [h["holder"] for h in seen["share_holders"]] == [s["holder"] for s in seen["share_devices"][:3:2]]
    assert all("user" not in h["holder"] and "id" not in h["holder"] for h in seen["share_holders"])

    class Portal:  # answers with the API's own answer, as the CLI's client would
        def request(self, method: str, path: str, **kwargs: Any) -> Any:
            return {"results": [shared]}

    assert gpuportal.cmd_gpus(Portal(), gpuportal.build_parser().parse_args(["gpus"])) == 0  # type: ignore[arg-type]
    lines = [line.split("└ ")[1] for line in capsys.readouterr().out.splitlines() if "└" in line]
    assert lines == [
        f"shares 1-2/4 31000/40960 MiB  SM 60%  job vision {half.pk}",  # the half's two shares: one line
        f"share 3/4   5000/20480 MiB  job vision {quarter.pk}",
    ]
    shared = seen  # another team's answer: the same lines, without the job ids
    assert gpuportal.cmd_gpus(Portal(), gpuportal.build_parser().parse_args(["gpus"])) == 0  # type: ignore[arg-type]
    lines = [line.split("└ ")[1] for line in capsys.readouterr().out.splitlines() if "└" in line]
    assert lines == ["shares 1-2/4 31000/40960 MiB  SM 60%  job vision", "share 3/4   5000/20480 MiB  job vision"]


def test_the_cli_names_a_holder_of_every_share_all_of_them():
    from cli import gpuportal

    gpu = {
        "shares": 4,
        "share_holders": [
            {"holder": {"kind": "job", "id": 9, "team": "vision"}, "indexes": [3, 1, 0, 2], "memory_mib": 81_920,
             "memory_used_mib": 70_000},
        ],
    }  # fmt: skip
    (line,) = gpuportal.share_lines(gpu)
    assert line.startswith("all 4 shares 70000/81920 MiB  job vision")

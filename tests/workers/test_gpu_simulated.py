"""SimulatedBackend: real specs, idle behaviour, profiles from the Alibaba GenAI trace, lags, determinism."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from workers.gpu.base import HEALTH_OK, GpuBackend, GpuSample
from workers.gpu.profiles import build_profiles
from workers.gpu.simulated import PROFILE_FILE, SimulatedBackend, load_profiles, parse_profile
from workers.gpu.specs import get_spec

T0 = 1_767_225_600.0
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def run(backend: SimulatedBackend, seconds: int, start: float = T0) -> list[list[GpuSample]]:
    return [backend.sample(start + t) for t in range(seconds)]


def column(ticks: list[list[GpuSample]], index: int, attr: str) -> list:
    return [getattr(tick[index], attr) for tick in ticks]


def test_discover_uses_real_specs_and_stable_uuids() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB", "H200-141GB", "V100-16GB"], seed=7)
    assert isinstance(backend, GpuBackend)
    infos = backend.discover()
    assert [(i.index, i.name, i.model, i.memory_mib) for i in infos] == [
        (0, "NVIDIA A100-SXM4-80GB", "A100-80GB", 81_920),
        (1, "NVIDIA H200", "H200-141GB", 143_771),
        (2, "Tesla V100-SXM2-16GB", "V100-16GB", 16_384),
    ]
    assert all(UUID.match(i.uuid) for i in infos)
    assert len({i.uuid for i in infos}) == 3
    again = SimulatedBackend("node-a", ["A100-80GB", "H200-141GB", "V100-16GB"], seed=7).discover()
    assert [i.uuid for i in again] == [i.uuid for i in infos]
    assert SimulatedBackend("node-a", ["A100-80GB"], seed=8).discover()[0].uuid != infos[0].uuid
    assert SimulatedBackend("node-b", ["A100-80GB"], seed=7).discover()[0].uuid != infos[0].uuid


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="A100-80GB"):
        SimulatedBackend("n", ["B300"])


def test_free_gpu_idles_near_ambient() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB"], seed=1, ambient_c=28.0)
    spec = get_spec("A100-80GB")
    ticks = run(backend, 600)
    assert set(column(ticks, 0, "utilization_pct")) == {0}
    assert max(column(ticks, 0, "memory_used_mib")) <= 5
    assert set(column(ticks, 0, "tensor_active")) == {0.0}
    assert set(column(ticks, 0, "sm_clock_mhz")) == {spec.sm_clock_idle_mhz}
    power = column(ticks, 0, "power_w")
    assert statistics.mean(power) == pytest.approx(spec.idle_w, rel=0.03)
    temps = column(ticks, 0, "temperature_c")
    idle_temp = 28.0 + spec.idle_w / spec.tdp_w * 45.0  # ambient + the rise idle power causes
    assert all(abs(t - idle_temp) <= 3 for t in temps)
    assert ticks[0][0].processes == [] and ticks[1][0].processes is None and ticks[10][0].processes == []


def test_same_seed_and_calls_give_identical_samples_and_other_seeds_do_not() -> None:
    def trace(seed: int) -> list[list[GpuSample]]:
        backend = SimulatedBackend("node-a", ["H100-80GB", "L40S-48GB"], seed=seed)
        uuids = [i.uuid for i in backend.discover()]
        out = run(backend, 100)
        backend.assign(uuids[0], "job-42")
        out += run(backend, 200, start=T0 + 100)
        backend.release(uuids[0])
        backend.assign(uuids[1], "job-43", "inference-steady-b")
        return out + run(backend, 100, start=T0 + 300)

    assert trace(5) == trace(5)
    assert trace(5) != trace(6)


def test_a_job_on_one_gpu_does_not_change_another_gpus_numbers() -> None:
    quiet = SimulatedBackend("node-a", ["A100-80GB", "A100-80GB"], seed=2)
    busy = SimulatedBackend("node-a", ["A100-80GB", "A100-80GB"], seed=2)
    busy.assign(busy.discover()[1].uuid, "job-1", "const:90")
    a, b = run(quiet, 120), run(busy, 120)
    assert [t[0] for t in a] == [t[0] for t in b]
    assert [t[1] for t in a] != [t[1] for t in b]


def test_constant_load_drives_power_fast_and_temperature_slowly() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB"], seed=3, ambient_c=28.0)
    spec = get_spec("A100-80GB")
    uuid = backend.discover()[0].uuid
    run(backend, 60)  # settle at idle
    backend.assign(uuid, "job-1", "const:80:0.5")
    ticks = run(backend, 600, start=T0 + 60)
    util = column(ticks, 0, "utilization_pct")
    assert statistics.mean(util) == pytest.approx(80, abs=2)
    assert min(util) > 40  # noise around a steady load, not dropouts to idle
    assert statistics.mean(column(ticks, 0, "memory_used_mib")) == pytest.approx(0.5 * 81_920, rel=0.01)
    target_w = spec.idle_w + (spec.tdp_w * 0.95 - spec.idle_w) * 0.8 * (0.6 + 0.4 * 0.5) + 0.02 * spec.tdp_w
    power = column(ticks, 0, "power_w")
    assert power[0] < spec.idle_w + 0.5 * (target_w - spec.idle_w)  # lag: not there on the first tick
    assert statistics.mean(power[10:]) == pytest.approx(target_w, rel=0.05)  # ~1.5 s time constant
    temps = column(ticks, 0, "temperature_c")
    target_c = 28.0 + target_w / spec.tdp_w * 45.0
    assert temps[10] < temps[0] + 0.4 * (target_c - temps[0])  # ~45 s time constant: still far after 10 s
    assert temps[-1] == pytest.approx(target_c, abs=2.5)
    assert set(column(ticks, 0, "sm_clock_mhz")) <= set(range(1_290, 1_411))
    assert 0.2 < statistics.mean(column(ticks, 0, "tensor_active")) < 0.6
    procs = ticks[0][0].processes or ticks[1][0].processes or ticks[9][0].processes
    assert procs is not None and len(procs) == 1 and procs[0][1] > 40_000


def test_release_returns_to_idle() -> None:
    backend = SimulatedBackend("node-a", ["H100-80GB"], seed=3)
    spec = get_spec("H100-80GB")
    uuid = backend.discover()[0].uuid
    backend.assign(uuid, "job-1", "const:100:0.9")
    run(backend, 300)
    assert backend.assignment(uuid) == ("job-1", "const:100:0.9")
    backend.release(uuid)
    after = run(backend, 30, start=T0 + 300)
    assert backend.assignment(uuid) is None
    assert set(column(after, 0, "utilization_pct")) == {0}
    assert max(column(after, 0, "memory_used_mib")) <= 5
    assert after[0][0].power_w > 2 * spec.idle_w  # lag on the way down too
    assert after[-1][0].power_w == pytest.approx(spec.idle_w, rel=0.08)
    assert after[-1][0].temperature_c > 40  # the heat sink is still warm after 30 s
    assert after[-1][0].sm_clock_mhz == spec.sm_clock_idle_mhz


def test_jobs_on_shares_keep_to_their_memory_budgets() -> None:
    # Two quarter jobs on one A100-80GB, each told a 20,480 MiB budget: each holds its profile's share of its
    # budget (a trace profile from the GenAI set, and a constant 0.9 of the device), never more than the budget.
    backend = SimulatedBackend("node-a", ["A100-80GB"], seed=5)
    uuid = backend.discover()[0].uuid
    backend.assign(uuid, "job-1", "const:40:0.9", memory_mib=20_480)
    backend.assign(uuid, "job-2", memory_mib=20_480)
    ticks = run(backend, 120)
    for tick in ticks[::10]:
        (sample,) = tick
        assert sample.memory_used_mib <= 2 * 20_480 + 5
    slow = backend.sample(T0 + 121)[0]
    by_pid = dict(slow.processes or [])
    assert len(by_pid) == 2
    assert all(0 < mib <= 20_480 for mib in by_pid.values()), by_pid
    assert max(by_pid.values()) == pytest.approx(0.9 * 20_480, rel=0.02)
    # Without a budget the same constant profile takes 0.9 of the whole device (capped at 97%).
    whole = SimulatedBackend("node-a", ["A100-80GB"], seed=5)
    w = whole.discover()[0].uuid
    whole.assign(w, "job-1", "const:40:0.9")
    assert whole.sample(T0)[0].memory_used_mib == pytest.approx(0.9 * 81_920, rel=0.02)
    with pytest.raises(ValueError, match="cannot be negative"):
        backend.assign(uuid, "job-3", memory_mib=-1)


def test_trace_profile_is_followed_minute_by_minute() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB"], seed=11)
    uuid = backend.discover()[0].uuid
    profile = load_profiles()["train-heavy-a"]
    backend.assign(uuid, "job-t", "train-heavy-a")
    run_s = 57 * 60
    ticks = run(backend, run_s)
    offset = backend._gpus[0].run.offset_s  # type: ignore[union-attr]  # where in the profile the job started
    util = column(ticks, 0, "utilization_pct")
    expected = [profile.at(offset + t)[0] for t in range(run_s)]
    # Each 57 s window of the simulation averages to the trace's own figure for that window (noise cancels).
    window_errors = [
        abs(statistics.mean(util[i : i + 57]) - statistics.mean(expected[i : i + 57])) for i in range(0, run_s, 57)
    ]
    assert max(window_errors) < 6
    assert statistics.mean(util) == pytest.approx(statistics.mean(expected), abs=1.5)
    # Where the trace says idle, the simulated GPU is exactly idle: idle detection must be able to see zeros.
    zero = [u for u, e in zip(util, expected, strict=True) if e == 0]
    assert zero and set(zero) == {0}
    mem = column(ticks, 0, "memory_used_mib")
    expected_mem = [profile.at(offset + t)[1] for t in range(run_s)]
    assert max(abs(m - e) / e for m, e in zip(mem, expected_mem, strict=True)) < 0.01


def test_default_profile_comes_from_the_job_key_and_gpus_of_one_job_run_in_step() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB"] * 4, seed=4)
    uuids = [i.uuid for i in backend.discover()]
    for u in uuids[:2]:
        backend.assign(u, "job-ddp")
    backend.assign(uuids[2], "job-other")
    first, second, other = (backend.assignment(u) for u in uuids[:3])
    assert other is not None and other[0] == "job-other"
    assert first == second and first is not None and first[0] == "job-ddp"
    assert parse_profile(first[1]).kind != "idle"
    ticks = run(backend, 57 * 10)
    a = [statistics.mean(column(ticks, 0, "utilization_pct")[i : i + 57]) for i in range(0, 570, 57)]
    b = [statistics.mean(column(ticks, 1, "utilization_pct")[i : i + 57]) for i in range(0, 570, 57)]
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 5
    assert column(ticks, 0, "utilization_pct") != column(ticks, 1, "utilization_pct")  # own noise per GPU
    again = SimulatedBackend("node-a", ["A100-80GB"] * 4, seed=4)
    again.assign(uuids[0], "job-ddp")
    assert again.assignment(uuids[0]) == first


def test_replay_idle_makes_free_gpus_follow_the_mostly_idle_trace() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB"], seed=1, replay_idle=True)
    profile = load_profiles()["idle-mostly"]
    ticks = run(backend, 57 * 30)
    util = column(ticks, 0, "utilization_pct")
    assert statistics.mean(util) < 3
    assert sum(u == 0 for u in util) / len(util) > 0.8  # a one-minute blip spreads over two by interpolation
    assert statistics.median(column(ticks, 0, "memory_used_mib")) > 0.5 * max(profile.mem_mib)
    plain = SimulatedBackend("node-a", ["A100-80GB"], seed=1)
    assert max(column(run(plain, 60), 0, "memory_used_mib")) <= 5


def test_bad_profiles_are_refused() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB"])
    uuid = backend.discover()[0].uuid
    with pytest.raises(ValueError, match=r"unknown profile 'nope'.*train-heavy-a"):
        backend.assign(uuid, "j", "nope")
    for bad in ("const:", "const:120", "const:50:2", "const:x"):
        with pytest.raises(ValueError, match="bad profile"):
            backend.assign(uuid, "j", bad)
    with pytest.raises(KeyError, match="no simulated GPU"):
        backend.assign("GPU-nope", "j")


def test_injected_faults_show_in_health() -> None:
    backend = SimulatedBackend("node-a", ["A100-80GB", "A100-80GB"], seed=1)
    uuids = [i.uuid for i in backend.discover()]
    backend.inject(uuids[0], xid=79)
    backend.inject(uuids[1], lost=True)
    ok, lost = backend.sample(T0)
    assert ok.health == {**HEALTH_OK, "ecc_dbe": 0, "xid": 1, "last_xid": 79, "lost": False}
    assert lost.health["lost"] is True and lost.error and lost.utilization_pct is None


def test_profile_file_is_small_and_well_formed() -> None:
    assert PROFILE_FILE.stat().st_size < 100_000
    doc = json.loads(PROFILE_FILE.read_text())
    assert "cluster-trace-v2026-GenAI" in doc["source"]
    assert doc["step_s"] == 57
    profiles = doc["profiles"]
    assert len(profiles) >= 12
    assert {p["kind"] for p in profiles.values()} >= {"training", "inference", "idle"}
    for p in profiles.values():
        assert len(p["util"]) == len(p["mem"]) > 100
        assert all(0 <= u <= 100 for u in p["util"]) and all(0 <= m <= 1000 for m in p["mem"])
    # The trace's headline: real GPUs idle most of the time. The profiles keep that shape.
    all_util = [u for p in profiles.values() for u in p["util"]]
    assert sum(u == 0 for u in all_util) / len(all_util) > 0.5


DATA = Path(build_profiles.DEFAULT_DATA)


@pytest.mark.skipif(not (DATA / "pod_gpu_duty_cycle_anon.tar.gz").exists(), reason="trace data not present")
def test_profile_file_is_what_the_generator_builds_from_the_trace() -> None:
    built = build_profiles.build(DATA, build_profiles.DEFAULT_POINTS)
    assert built == json.loads(PROFILE_FILE.read_text())


def test_device_counters_follow_the_simulated_load_and_report_a_driver_version() -> None:
    backend = SimulatedBackend("n1", ["H100-80GB", "L40S-48GB"], seed=3)
    h100, l40s = backend.discover()
    assert h100.extra["driver_version"] and l40s.extra["driver_version"]
    backend.assign(h100.uuid, "job-1", profile="const:90:0.5")
    first = backend.sample(T0)
    later = backend.sample(T0 + 10)
    busy, idle = later
    assert set(busy.counters) == {"mt", "mc", "en", "ptx", "prx", "prc", "nvl"}
    assert "nvl" not in idle.counters  # a PCIe board has no NVLink
    # Energy integrates power: ten seconds above 100 W are more than a million mJ.
    assert busy.counters["en"] - first[0].counters["en"] > 10 * 100 * 1000
    assert busy.counters["nvl"] > first[0].counters["nvl"] and busy.counters["prx"] > idle.counters["prx"]
    assert busy.counters["mt"] > busy.temperature_c  # HBM runs warmer than the die sensor
    backend.inject(h100.uuid, remapped_rows=(2, 1), remap_failed=True)
    health = backend.sample(T0 + 11)[0].health
    assert (health["remap_cor"], health["remap_unc"], health["remap_fail"]) == (2, 1, True)


def test_set_layout_makes_the_instances_anew_as_mig_parted_does() -> None:
    sim = SimulatedBackend("n1", ["A100-80GB:mig=1g.10gb*7"], seed=1)
    (gpu,) = sim.discover()
    first = gpu.mig_devices
    sim.assign(first[0].uuid, "job-1")
    again = sim.set_layout(gpu.uuid, "1g.10gb*7")  # the same layout made again: new uuids
    assert [d.profile for d in again] == [d.profile for d in first]
    assert not {d.uuid for d in again} & {d.uuid for d in first}
    assert all(sim.assignment(d.uuid) is None for d in again)
    assert not sim._gpus[0].mig_runs  # the job on the vanished instance is gone with it
    assert sim.refresh_layout() is True and sim.refresh_layout() is False
    assert sim.discover()[0].mig_devices == again
    assert sim.set_layout(gpu.uuid, "") == () and not sim.discover()[0].mig_mode
    with pytest.raises(ValueError):
        sim.set_layout(gpu.uuid, "7g.80gb+1g.10gb")  # more slices than the GPU has

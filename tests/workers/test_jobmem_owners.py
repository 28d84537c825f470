"""Whose are the processes of no job on a GPU (workers/jobmem.py `others_by_uid`): real processes started as two
different users, a /proc the test writes, the simulated backend's loads, and the `"ou"` list on the wire."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from workers.gpu.base import GpuSample, row_to_sample, sample_to_row
from workers.gpu.simulated import SimulatedBackend
from workers.jobmem import JobMemory, RunningJob, uid_of

NOBODY = 65534


def sample(uuid: str = "GPU-a", memory_used_mib: int = 1000, **fields: Any) -> GpuSample:
    return GpuSample(uuid, 0.0, 50, memory_used_mib, 81920, 40, 100.0, 1400, **fields)


def write_status(proc: Path, pid: int, uid: int | None) -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    lines = [f"Name:\tpython{pid}", f"Pid:\t{pid}"]
    if uid is not None:
        lines.append(f"Uid:\t{uid}\t{uid + 1}\t{uid}\t{uid}")  # real, effective, saved, fs
    (folder / "status").write_text("\n".join(lines) + "\n")


def test_the_owner_is_the_processes_real_uid(tmp_path: Path) -> None:
    assert uid_of(os.getpid()) == os.getuid()
    assert uid_of(2**22 + 12345) is None  # gone
    write_status(tmp_path, 10, 1001)
    write_status(tmp_path, 11, None)  # no Uid line (not a Linux /proc): unknown, not root
    assert uid_of(10, tmp_path) == 1001 and uid_of(11, tmp_path) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_real_processes_of_two_users_are_told_apart() -> None:
    """Two processes started as different users hold GPU memory beside a job's: each owner gets its own."""
    sleeper = ["/bin/sleep", "60"]  # one that any user may run, from a folder any user may enter
    theirs = subprocess.Popen(sleeper, user=NOBODY, cwd="/")
    mine = subprocess.Popen(sleeper, cwd="/")
    try:
        deadline = time.monotonic() + 10
        while uid_of(theirs.pid) != NOBODY and time.monotonic() < deadline:
            time.sleep(0.02)  # the child drops to the user just after the fork
        jobs = [RunningJob(5, ("GPU-a",), "")]
        owner = {101: 5}
        listing = sample(
            memory_used_mib=3_000,
            processes=[(101, 900), (theirs.pid, 1_200), (mine.pid, 700)],
            process_util={101: 40, theirs.pid: 35, mine.pid: 0},
        )
        (out,) = JobMemory(lambda: jobs, job_of_pid=owner.get).annotate([listing])
        assert out.job_memory == {5: 900} and out.others == (1_900, 35)
        assert out.others_by_uid == {NOBODY: (1_200, 35), os.getuid(): (700, 0)}
        extra = sample_to_row(out)[-1]
        assert extra["ou"] == sorted([[NOBODY, 1_200, 35], [os.getuid(), 700, 0]])
        assert row_to_sample(sample_to_row(out), 0.0).others_by_uid == out.others_by_uid
    finally:
        for process in (theirs, mine):
            process.kill()
            process.wait()


def test_owners_are_said_only_where_the_listing_is_complete(tmp_path: Path) -> None:
    for pid, uid in ((201, 1001), (202, 1001), (203, 1002)):
        write_status(tmp_path, pid, uid)
    jobs = [RunningJob(7, ("GPU-a",), "")]
    listing = sample(
        memory_used_mib=2_000,
        processes=[(101, 500), (201, 300), (202, 200), (203, 600), (299, 100)],  # 299: gone before its owner read
        process_util={101: 50, 201: 10, 202: 15, 203: 70, 299: 5},
    )
    annotate = JobMemory(lambda: jobs, job_of_pid={101: 7}.get, proc=tmp_path).annotate
    (out,) = annotate([listing])
    # One owner's processes add up; a process whose owner is unknown counts in the total only.
    assert out.others == (1_200, 100) and out.others_by_uid == {1001: (500, 25), 1002: (600, 70)}
    # Nothing of no job's: an empty list, said (everyone ran nothing), not left out.
    (alone,) = annotate([sample(memory_used_mib=600, processes=[(101, 500)], process_util={101: 50})])
    assert alone.others_by_uid == {} and sample_to_row(alone)[-1]["ou"] == []
    # Memory the listing does not explain: no owner is judged on it.
    (hidden,) = annotate([sample(memory_used_mib=40_000, processes=[(201, 300)])])
    assert hidden.others is None and hidden.others_by_uid is None and "ou" not in sample_to_row(hidden)[-1]
    # Under MPS the processes' SM figures are not theirs: memory only.
    (mps,) = JobMemory(lambda: jobs, job_of_pid={101: 7}.get, proc=tmp_path, process_activity=False).annotate([listing])
    assert mps.others_by_uid == {1001: (500, None), 1002: (600, None)}
    assert sample_to_row(mps)[-1]["ou"] == [[1001, 500], [1002, 600]]


def test_simulated_loads_carry_their_owner_and_never_read_the_hosts_proc() -> None:
    backend = SimulatedBackend("n1", ["A100-80GB"], seed=5)
    (shared,) = backend.discover()
    backend.assign(shared.uuid, "alice-notebook", "const:60:0.2", memory_mib=20_480, uid=1001)
    backend.assign(shared.uuid, "bob-notebook", "const:0:0.1", memory_mib=20_480, uid=1002)
    backend.assign(shared.uuid, "job-9", "const:30:0.1", memory_mib=20_480)
    jobs = [RunningJob(9, (shared.uuid,), "")]
    (out,) = JobMemory(lambda: jobs, job_of_pid=backend.job_of_pid, uid_of_pid=backend.uid_of_pid).annotate(
        backend.sample(time.time())
    )
    owners = out.others_by_uid or {}
    assert set(owners) == {1001, 1002} and set(out.job_memory or {}) == {9}
    assert (owners[1001][1] or 0) > 30 and owners[1002][1] == 0 and owners[1002][0] > 0

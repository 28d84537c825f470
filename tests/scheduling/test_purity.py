"""The core must stay free of Django so the trace replay and unit tests run without settings or a database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_scheduling_core_imports_no_django() -> None:
    code = (
        "import sys; import apps.jobs.scheduling, bench.trace_replay, bench.scheduler_pass; "
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


SCRIPT = """
import random
from apps.jobs.scheduling import FAIR, BACKFILL, schedule
from tests.scheduling.builders import NOW, gpus, job, reservation, running, snapshot
rng = random.Random(11)
fleet = gpus({"a": ("A100", 8), "b": ("A100", 4), "c": ("T4", 4)})
pending = [job(f"j{i}", gpus=rng.choice([1, 2, 4]), duration=rng.choice([600, 7200]), team=rng.choice("xyz"),
               submitted=NOW - rng.randrange(5) * 60, models=rng.choice([None, {"T4", "A100"}, {"T4"}]))
           for i in range(30)]
run = [running("r", ["a-g0"], ends_in=300, team="x")]
resv = [reservation("R", ["b-g0", "b-g1"], start_in=900, end_in=4000, team="y")]
usage = {"x": 1234.5, "y": 99.0, "z": 1e5}
for policy in (FAIR, BACKFILL):
    print(repr(schedule(snapshot(fleet, pending, run=run, reservations=resv, usage=usage), policy=policy, now=NOW)))
"""


def test_decisions_do_not_depend_on_the_process_hash_seed() -> None:
    outputs = []
    for seed in ("1", "2", "3"):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, check=True
        )
        outputs.append(result.stdout)
    assert outputs[0] and outputs[0] == outputs[1] == outputs[2]

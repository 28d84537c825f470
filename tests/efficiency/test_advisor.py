"""The batch-size/AMP advisor on the CPU with tiny sizes: both precisions grow until the limit, the best batch size
leaves the margin free, and its result line is what the job page reads."""

from __future__ import annotations

import json

import pytest

from apps.efficiency.jobinfo import advisor_result
from workers.probes.advisor import RESULT_PREFIX, Run, main, pick_best

TINY = ["--device", "cpu", "--d-model", "16", "--layers", "1", "--seq-len", "8", "--vocab", "50", "--steps", "1"]


def test_cpu_run_grows_batches_in_both_precisions_and_names_the_best(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--max-batch", "8", "--json"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(RESULT_PREFIX)
    body = json.loads(line[len(RESULT_PREFIX) :])
    assert body["device"] == "cpu" and body["amp_dtype"] == "bf16" and body["measured_memory"] is False
    assert [(r["precision"], r["batch_size"]) for r in body["runs"]] == [
        (p, b) for p in ("fp32", "bf16") for b in (1, 2, 4, 8)
    ]
    assert all(r["ok"] and r["samples_per_s"] > 0 and r["peak_mib"] > 0 for r in body["runs"])
    fp32 = [r["peak_mib"] for r in body["runs"] if r["precision"] == "fp32"]
    assert fp32 == sorted(fp32) and fp32[-1] > fp32[0]  # memory grows with the batch
    assert body["best"]["samples_per_s"] == max(r["samples_per_s"] for r in body["runs"])
    parsed = advisor_result([line])
    assert parsed is not None and parsed["best"] == body["best"] and len(parsed["runs"]) == 8


def test_a_memory_limit_stops_the_growth() -> None:
    import argparse

    from workers.probes.advisor import advise, parse

    cfg: argparse.Namespace = parse([*TINY, "--max-batch", "64", "--limit-mib", "0.3"])
    report = advise(cfg)
    fp32 = [r for r in report.runs if r.precision == "fp32"]
    assert fp32[-1].batch_size < 64 and (fp32[-1].peak_mib or 0) > 0.3  # stopped at the first over the limit
    assert report.best is not None and report.best["peak_mib"] <= 0.9 * 0.3


def test_best_keeps_the_safety_margin() -> None:
    runs = [
        Run("fp32", 8, True, 100.0, 50.0),
        Run("fp32", 16, True, 180.0, 85.0),
        Run("bf16", 16, True, 250.0, 95.0),  # fastest, but inside the last 10%
        Run("bf16", 32, False, error="out of memory"),
    ]
    assert pick_best(runs, 100.0, 0.1) == {
        "precision": "fp32",
        "batch_size": 16,
        "samples_per_s": 180.0,
        "peak_mib": 85.0,
    }
    assert pick_best(runs, None, 0.1)["batch_size"] == 16  # no limit: the fastest
    assert pick_best([Run("fp32", 1, False, error="out of memory")], 100.0, 0.1) is None


def test_a_broken_result_line_is_ignored() -> None:
    assert advisor_result([RESULT_PREFIX + "{not json"]) is None
    assert advisor_result(["plain output"]) is None

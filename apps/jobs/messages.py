"""Agent -> portal job reports: shapes and strict validation (plain Python; a GPU node runs users' code).

Each report is one JSON object, the single argument of a task on queue `control`, carrying `node` and `token`
like every agent message (apps/fleet/messages.py). Refused as a whole on the first bad field.

- jobs.report_started   {"job_id", "handle", "at"}
- jobs.report_logs      {"batches": [{"job_id", "epoch", "first", "lines": [[stream, text, ts], ...]}, ...]}
- jobs.report_exit      {"job_id", "state", "reason", "exit_code", "message", "finished_at", "log_total",
                         and "handle", "started_at" when the job ended before its start was reported}
- jobs.report_inventory {"jobs": [{"job_id", "status"}], "complete": bool}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apps.fleet.messages import Envelope, MessageRejected, check_envelope, check_float, check_int, check_str

MAX_JOB_ID = 2**62
MAX_BATCHES = 1000
MAX_LINES_PER_BATCH = 5000
MAX_LINE_CHARS = 64 * 1024
MAX_INVENTORY = 10_000
OUTCOME_STATES = {"succeeded", "failed", "cancelled"}
OUTCOME_REASONS = {"exit_code", "oom", "timeout", "cancelled", "launch_error"}


def _require(cond: bool, reason: str, detail: str) -> None:
    if not cond:
        raise MessageRejected(reason, detail)


def _time(value: Any, name: str) -> datetime | None:
    ts = check_float(value, name, 0.0, 1e11, nullable=True)
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


def _job_id(value: Any) -> int:
    return int(check_int(value, "job_id", 1, MAX_JOB_ID))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Started:
    envelope: Envelope
    job_id: int
    handle: str
    at: datetime | None


def check_started(payload: Any) -> Started:
    env = check_envelope(payload)
    return Started(
        envelope=env,
        job_id=_job_id(payload.get("job_id")),
        handle=check_str(payload.get("handle"), "handle", max_len=200, blank=True),
        at=_time(payload.get("at"), "at"),
    )


@dataclass(frozen=True)
class Line:
    stream: str
    text: str
    at: datetime


@dataclass(frozen=True)
class LogBatch:
    job_id: int
    epoch: str
    first: int
    lines: list[Line]


@dataclass(frozen=True)
class Logs:
    envelope: Envelope
    batches: list[LogBatch]


def check_logs(payload: Any) -> Logs:
    env = check_envelope(payload)
    raw = payload.get("batches")
    _require(isinstance(raw, list) and len(raw) <= MAX_BATCHES, "malformed", "batches must be a list")
    batches: list[LogBatch] = []
    for i, b in enumerate(raw):
        _require(isinstance(b, dict), "malformed", f"batches[{i}] is not an object")
        lines_raw = b.get("lines")
        _require(
            isinstance(lines_raw, list) and 0 < len(lines_raw) <= MAX_LINES_PER_BATCH,
            "malformed",
            f"batches[{i}].lines must be a non-empty list",
        )
        lines: list[Line] = []
        for item in lines_raw:
            _require(isinstance(item, list) and len(item) == 3, "malformed", "a line is [stream, text, ts]")
            stream, text, ts = item
            _require(stream in ("stdout", "stderr"), "malformed", "stream must be stdout or stderr")
            _require(isinstance(text, str) and len(text) <= MAX_LINE_CHARS, "malformed", "line text")
            at = _time(ts, "ts")
            lines.append(Line(stream=stream, text=text.replace("\x00", ""), at=at or datetime.now(tz=UTC)))
        batches.append(
            LogBatch(
                job_id=_job_id(b.get("job_id")),
                epoch=check_str(b.get("epoch"), "epoch", max_len=40),
                first=int(check_int(b.get("first"), "first", 1, 2**62)),  # type: ignore[arg-type]
                lines=lines,
            )
        )
    return Logs(envelope=env, batches=batches)


@dataclass(frozen=True)
class Exit:
    envelope: Envelope
    job_id: int
    state: str
    reason: str
    exit_code: int | None
    message: str
    finished_at: datetime | None
    log_total: int | None
    started_at: datetime | None = None
    handle: str = ""


def check_exit(payload: Any) -> Exit:
    env = check_envelope(payload)
    state = payload.get("state")
    reason = payload.get("reason")
    _require(state in OUTCOME_STATES, "malformed", "state")
    _require(reason in OUTCOME_REASONS, "malformed", "reason")
    return Exit(
        envelope=env,
        job_id=_job_id(payload.get("job_id")),
        state=state,
        reason=reason,
        exit_code=check_int(payload.get("exit_code"), "exit_code", -(2**31), 2**31, nullable=True),
        message=check_str(payload.get("message"), "message", max_len=8000, blank=True),
        finished_at=_time(payload.get("finished_at"), "finished_at"),
        log_total=check_int(payload.get("log_total"), "log_total", 0, 2**62, nullable=True),
        started_at=_time(payload.get("started_at"), "started_at"),
        handle=check_str(payload.get("handle"), "handle", max_len=200, blank=True),
    )


@dataclass(frozen=True)
class Inventory:
    envelope: Envelope
    jobs: list[tuple[int, str]]
    complete: bool


# exited: its exit was reported a moment ago (the report may be behind this inventory in the portal's workers).
INVENTORY_STATUSES = ("running", "launching", "exited")


def check_inventory(payload: Any) -> Inventory:
    env = check_envelope(payload)
    raw = payload.get("jobs")
    _require(isinstance(raw, list) and len(raw) <= MAX_INVENTORY, "malformed", "jobs must be a list")
    jobs: list[tuple[int, str]] = []
    for item in raw:
        _require(isinstance(item, dict), "malformed", "a job is an object")
        status = item.get("status")
        _require(status in INVENTORY_STATUSES, "malformed", "status must be running, launching or exited")
        jobs.append((_job_id(item.get("job_id")), str(status)))
    complete = payload.get("complete", True)
    _require(isinstance(complete, bool), "malformed", "complete must be a boolean")
    return Inventory(envelope=env, jobs=jobs, complete=complete)

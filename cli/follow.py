"""A job's output as it comes, in order, until the job has ended and its last lines are in; one line that says
how a job stands."""

from __future__ import annotations

import sys
import time
from typing import Any

from cli.client import Client
from cli.exits import TERMINAL

POLL_S = 0.5
LOG_GRACE_S = 10.0  # after the job ends, how long to wait for its last log lines to arrive
# ... and how much longer while the portal says lines are held back at a missing one (it passes the gap itself).
WAITING_GRACE_S = 60.0
# A gap in the line numbers is usually a batch that arrives late (the portal's other worker took it second, or the
# node sent it again after a broker outage): the lines after it wait this long for it, then print anyway.
GAP_WAIT_S = 3.0


def describe(job: dict[str, Any]) -> str:
    parts = [f"job {job['id']}", str(job["state"])]
    if job.get("reason") and job["reason"] != "exit_code":
        parts.append(f"({job['reason']})")
    if job.get("exit_code") is not None:
        parts.append(f"exit {job['exit_code']}")
    if job.get("node"):
        parts.append(f"on {job['node']}")
    text = " ".join(parts)
    if job.get("message") and job["state"] in TERMINAL and job.get("reason") != "exit_code":
        text += f": {job['message']}"
    elif job["state"] == "queued" and job.get("pending_message"):
        text += f": {job['pending_message']}"
    return text


def say(text: str) -> None:
    print(f"gpuportal: {text}", file=sys.stderr, flush=True)


def print_lines(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        stream = sys.stderr if line.get("stream") == "stderr" else sys.stdout
        print(line["line"], file=stream)
    sys.stdout.flush()
    sys.stderr.flush()


def until_gap(lines: list[dict[str, Any]], after: int) -> list[dict[str, Any]]:
    """The lines that follow `after` without a gap in their numbers."""
    out = []
    for line in lines:
        if line["seq"] != after + 1:
            break
        out.append(line)
        after = line["seq"]
    return out


def follow(client: Client, job_id: int, *, show_logs: bool = True, quiet: bool = False) -> dict[str, Any]:
    """Print the job's logs as they come until it has ended and its last lines are in; return the final job.

    Lines print in order: the portal holds back the lines after a gap in their numbers while the missing ones may
    still arrive (a portal without that: the rest waits here up to GAP_WAIT_S); a gap that stays - lines the portal
    no longer keeps, or never got - is then passed over."""
    after = 0
    last_state = ""
    ended_at: float | None = None
    gap_since: float | None = None
    waiting = False
    while True:
        if show_logs:
            while True:
                body = client.request("GET", f"/jobs/{job_id}/logs/", params={"after": after, "limit": 5000})
                waiting = bool(body.get("waiting"))
                lines = body["lines"]
                # A portal that says `waiting` holds lines back at a gap itself and gives them once the gap is
                # filled or has waited long enough; for an older one, the wait is done here.
                ready = lines if "waiting" in body else until_gap(lines, after)
                if len(ready) < len(lines):
                    gap_since = gap_since if gap_since is not None else time.monotonic()
                    if time.monotonic() - gap_since >= GAP_WAIT_S:
                        ready, gap_since = lines, None
                else:
                    gap_since = None
                print_lines(ready)
                if ready:
                    after = ready[-1]["seq"]
                if len(ready) < len(lines) or not body.get("more"):
                    break
        job = client.request("GET", f"/jobs/{job_id}/")
        # The final state is said once, after the job's last lines.
        if job["state"] != last_state and job["state"] not in TERMINAL and not quiet:
            say(describe(job))
            last_state = job["state"]
        if job["state"] in TERMINAL:
            if ended_at is None:
                ended_at = time.monotonic()
            complete = job.get("logs_complete") and after >= job.get("log_seq", 0) and not waiting
            grace = LOG_GRACE_S + (WAITING_GRACE_S if waiting else 0.0)
            if not show_logs or complete or time.monotonic() - ended_at > grace:
                if not quiet:
                    say(describe(job))
                return dict(job)
        time.sleep(POLL_S)

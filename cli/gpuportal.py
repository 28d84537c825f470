"""`gpuportal`: the GPU Portal command-line client, for CI pipelines and terminals. Needs only `requests`.

    export GPUPORTAL_URL=https://gpus.example.org GPUPORTAL_TOKEN=gpp_...
    gpuportal submit --gpus 1 --image pytorch/pytorch:2.4 --max-duration 3600 --env SEED=1 --wait -- python train.py
    gpuportal status 42          gpuportal logs 42 --follow          gpuportal cancel 42
    gpuportal gpus               gpuportal reserve --gpus 2 --model A100-80GB --start 2026-03-01T09:00 --end ...

`submit --wait` streams the job's output (stdout to stdout, stderr to stderr) and exits with the job's exit code:
0 succeeded; the job's own code when it failed with one; 124 timed out; 125 could not be launched; 130 cancelled
(also when you press Ctrl-C: the job is cancelled first); 137 killed for memory (OOM); 75 lost with its node.
Client errors: 2 for a refused request (the portal's message is printed), 1 for anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import requests

TERMINAL = {"succeeded", "failed", "cancelled", "lost"}
REASON_EXIT = {"timeout": 124, "launch_error": 125, "oom": 137, "node_lost": 75, "cancelled": 130, "preempted": 130}
STATE_EXIT = {"cancelled": 130, "lost": 75}
POLL_S = 0.5
LOG_GRACE_S = 10.0  # after the job ends, how long to wait for its last log lines to arrive
# ... and how much longer while the portal says lines are held back at a missing one (it passes the gap itself).
WAITING_GRACE_S = 60.0
# A gap in the line numbers is usually a batch that arrives late (the portal's other worker took it second, or the
# node sent it again after a broker outage): the lines after it wait this long for it, then print anyway.
GAP_WAIT_S = 3.0


class CliError(Exception):
    """A failure to report and exit with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Client:
    """Talks to the portal's REST API v1 with a bearer token; turns the error shape into CliError."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.base = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})
        self.session.headers["User-Agent"] = "gpuportal-cli/1"
        self.timeout = timeout

    def request(
        self, method: str, path: str, *, retries: int = 3, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> Any:
        """Retries connection errors, 429 and 5xx (POSTs only with an Idempotency-Key, so never twice)."""
        idempotent = method in ("GET", "HEAD") or bool(headers and "Idempotency-Key" in headers)
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self.session.request(
                    method, f"{self.base}/api/v1{path}", timeout=self.timeout, headers=headers, **kwargs
                )
            except requests.RequestException as exc:
                if idempotent and attempt <= retries:
                    time.sleep(min(2**attempt, 10))
                    continue
                raise CliError(f"cannot reach {self.base}: {exc}") from exc
            if resp.status_code == 409 and _code(resp) == "idempotency_in_progress" and attempt <= retries + 5:
                time.sleep(1)
                continue
            if (resp.status_code == 429 or resp.status_code >= 500) and idempotent and attempt <= retries:
                time.sleep(float(resp.headers.get("Retry-After", min(2**attempt, 10))))
                continue
            if resp.status_code >= 400:
                raise CliError(_error_text(resp), 2 if resp.status_code < 500 else 1)
            if resp.status_code == 204 or not resp.content:
                return None
            return resp.json()


def _code(resp: requests.Response) -> str:
    try:
        return str(resp.json().get("code", ""))
    except ValueError:
        return ""


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    if not isinstance(body, dict):
        return f"HTTP {resp.status_code}"
    text = f"{body.get('detail') or 'request refused'} ({body.get('code', resp.status_code)})"
    fields = body.get("fields") or {}
    for name, messages in fields.items():
        if isinstance(messages, list):
            text += f"\n  {name}: {'; '.join(str(m) for m in messages)}"
    return text


def exit_code_of(job: dict[str, Any]) -> int:
    """The process exit code that stands for how the job ended."""
    state, reason, code = job.get("state"), job.get("reason"), job.get("exit_code")
    if state == "succeeded":
        return 0
    if reason == "exit_code" and isinstance(code, int) and code != 0:
        return code if 0 < code < 256 else 1
    if reason in REASON_EXIT:
        return REASON_EXIT[str(reason)]
    return STATE_EXIT.get(str(state), 1)


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


def _say(text: str) -> None:
    print(f"gpuportal: {text}", file=sys.stderr, flush=True)


def _print_lines(lines: list[dict[str, Any]]) -> None:
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
                _print_lines(ready)
                if ready:
                    after = ready[-1]["seq"]
                if len(ready) < len(lines) or not body.get("more"):
                    break
        job = client.request("GET", f"/jobs/{job_id}/")
        if job["state"] != last_state and not quiet:
            _say(describe(job))
            last_state = job["state"]
        if job["state"] in TERMINAL:
            if ended_at is None:
                ended_at = time.monotonic()
            complete = job.get("logs_complete") and after >= job.get("log_seq", 0) and not waiting
            grace = LOG_GRACE_S + (WAITING_GRACE_S if waiting else 0.0)
            if not show_logs or complete or time.monotonic() - ended_at > grace:
                return dict(job)
        time.sleep(POLL_S)


# --- Commands ---------------------------------------------------------------------------------------------------


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    if not args.argv:
        raise CliError("give the command after --, e.g. gpuportal submit --image IMG -- python train.py", 2)
    env: dict[str, str] = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--env {item!r}: expected NAME=value", 2)
        env[name] = value
    body: dict[str, Any] = {"image": args.image, "command": list(args.argv), "gpu_count": args.gpus, "env": env}
    for key, value in (
        ("team", args.team),
        ("name", args.name),
        ("max_duration_s", args.max_duration),
        ("cpus", args.cpus),
        ("memory_mib", args.memory),
        ("priority", args.priority),
        ("reservation", args.reservation),
    ):
        if value is not None:
            body[key] = value
    if args.model:
        models = [m for m in args.model.split(",") if m]
        body["gpu_model"] = models[0] if len(models) == 1 else models
    # One key for every retry of this submission: a lost answer never queues the job twice.
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    job = client.request("POST", "/jobs/", json=body, headers={"Idempotency-Key": key})
    if not args.wait:
        print(json.dumps(job, indent=2) if args.json else job["id"])
        return 0
    _say(f"job {job['id']} submitted: {client.base}/jobs/{job['id']}/")
    try:
        final = follow(client, int(job["id"]), show_logs=not args.no_logs)
    except KeyboardInterrupt:
        _say(f"interrupted: cancelling job {job['id']}")
        try:
            client.request("POST", f"/jobs/{job['id']}/cancel/")
        except CliError as exc:
            _say(str(exc))
        return 130
    if args.json:
        print(json.dumps(final, indent=2))
    code = exit_code_of(final)
    if final["state"] != "succeeded":
        _say(describe(final))
    return code


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.request("GET", f"/jobs/{args.job_id}/")
    if args.json:
        print(json.dumps(job, indent=2))
    else:
        print(describe(job))
        print(f"  image {job['image']}  command {json.dumps(job['command'])}")
        print(f"  {job['gpu_count']} GPU(s)  submitted {job['submitted_at']}  cost {job['cost']} {job['currency']}")
    return 0


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.follow:
        final = follow(client, args.job_id, quiet=True)
        return exit_code_of(final)
    after = 0
    while True:
        body = client.request("GET", f"/jobs/{args.job_id}/logs/", params={"after": after, "limit": 5000})
        _print_lines(body["lines"])
        after = body["last_seq"]
        if not body.get("more"):
            return 0


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.request("POST", f"/jobs/{args.job_id}/cancel/")
    print(describe(job))
    return 0


def cmd_gpus(client: Client, args: argparse.Namespace) -> int:
    body = client.request("GET", "/gpus/", params={"limit": 1000})
    rows = body.get("results", body) if isinstance(body, dict) else body
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NODE':<16} {'#':>2} {'MODEL':<14} {'STATUS':<9} {'UTIL':>5} {'MEMORY':>15}  HOLDER")
    for g in rows:
        util = "-" if g.get("utilization") is None else f"{g['utilization']}%"
        used, total = g.get("memory_used_mib"), g.get("memory_total_mib") or g.get("memory_mib")
        mem = "-" if used is None else f"{used}/{total} MiB"
        holder = g.get("holder") or {}
        who = " ".join(str(holder[k]) for k in ("kind", "team", "job_id") if holder.get(k) is not None)
        print(f"{g['node']:<16} {g['index']:>2} {g['model']:<14} {g['status']:<9} {util:>5} {mem:>15}  {who}")
    return 0


def cmd_reserve(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"gpu_count": args.gpus, "start": args.start, "end": args.end, "note": args.note or ""}
    if args.team:
        body["team"] = args.team
    else:
        me = client.request("GET", "/me")
        teams = [t["team"]["slug"] if isinstance(t["team"], dict) else t["team"] for t in me.get("teams", [])]
        if len(teams) != 1:
            raise CliError(f"say which team with --team (you are in: {', '.join(map(str, teams)) or 'none'})", 2)
        body["team"] = teams[0]
    if args.model:
        body["gpu_model"] = args.model
    key = f"cli-{uuid.uuid4()}"
    resv = client.request("POST", "/reservations/", json=body, headers={"Idempotency-Key": key})
    if args.json:
        print(json.dumps(resv, indent=2))
    else:
        gpus = ", ".join(str(g.get("uuid", g)) if isinstance(g, dict) else str(g) for g in resv.get("gpus", []))
        print(f"reservation {resv['id']}: {resv.get('gpu_count')} GPU(s) {resv['start']} → {resv['end']} [{gpus}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuportal",
        description="GPU Portal client. Configure with GPUPORTAL_URL and GPUPORTAL_TOKEN.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=os.environ.get("GPUPORTAL_URL"), help="default: $GPUPORTAL_URL")
    parser.add_argument("--json", action="store_true", help="print JSON")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("submit", help="submit a job: gpuportal submit --gpus 1 --image IMG --wait -- argv...")
    p.add_argument("--image", required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--model", help="GPU model, or several separated by commas")
    p.add_argument("--max-duration", type=int, help="seconds; the job is stopped after this")
    p.add_argument("--env", action="append", metavar="NAME=VALUE")
    p.add_argument("--team")
    p.add_argument("--name")
    p.add_argument("--cpus", type=float)
    p.add_argument("--memory", type=int, help="MiB")
    p.add_argument("--priority", type=int)
    p.add_argument("--reservation", type=int, help="run inside this reservation of your team")
    p.add_argument("--idempotency-key", help="default: a fresh one (retries of this call reuse it)")
    p.add_argument("--wait", action="store_true", help="stream the logs and exit with the job's exit code")
    p.add_argument("--no-logs", action="store_true", help="with --wait: only wait")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    p.set_defaults(run=cmd_submit)

    p = sub.add_parser("status", help="one job's state")
    p.add_argument("job_id", type=int)
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("logs", help="a job's output")
    p.add_argument("job_id", type=int)
    p.add_argument("--follow", "-f", action="store_true", help="until the job ends; exit with its exit code")
    p.set_defaults(run=cmd_logs)

    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job_id", type=int)
    p.set_defaults(run=cmd_cancel)

    p = sub.add_parser("gpus", help="the fleet's GPUs with live utilization")
    p.set_defaults(run=cmd_gpus)

    p = sub.add_parser("reserve", help="book GPUs for a time window")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--model")
    p.add_argument("--start", required=True, help="ISO 8601, e.g. 2026-03-01T09:00:00+01:00")
    p.add_argument("--end", required=True)
    p.add_argument("--team")
    p.add_argument("--note")
    p.set_defaults(run=cmd_reserve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "argv", None) and args.argv[0] == "--":
        args.argv = args.argv[1:]
    token = os.environ.get("GPUPORTAL_TOKEN", "")
    if not args.url:
        _say("set GPUPORTAL_URL (or --url) to the portal's address")
        return 2
    if not token:
        _say("set GPUPORTAL_TOKEN to a personal API token (Settings → API tokens)")
        return 2
    client = Client(args.url, token)
    try:
        return int(args.run(client, args))
    except CliError as exc:
        _say(f"error: {exc}")
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

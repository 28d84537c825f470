"""`gpuportal`: the GPU Portal command-line client, for CI pipelines and terminals. Needs only `requests`.

    export GPUPORTAL_URL=https://gpus.example.org GPUPORTAL_TOKEN=gpp_...
    gpuportal submit --gpus 1 --image pytorch/pytorch:2.4 --max-duration 3600 --env SEED=1 --wait -- python train.py
    gpuportal status 42          gpuportal logs 42 --follow          gpuportal cancel 42
    gpuportal gpus               gpuportal reserve --gpus 2 --model A100-80GB --start 2026-03-01T09:00 --end ...

`submit --wait` streams the job's output (stdout to stdout, stderr to stderr) and exits with the job's exit code:
0 succeeded; the job's own code when it failed with one; 124 timed out; 125 could not be launched; 130 cancelled
(also when Ctrl-C, SIGTERM or SIGHUP stops the client: it cancels the job first); 137 killed for memory (OOM); 75
lost with its node.
The client's own failures: 200 bad command line or configuration; 201 refused by the portal; 202 portal
unreachable; 203 no answer within --timeout; 204 portal error (docs/ci-examples.md; --client-error-code maps them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

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
TIMEOUT_S = 30.0  # the longest one call to the portal may take, its retries included (--timeout)
CANCEL_TIMEOUT_S = 10.0  # a runner that sent SIGTERM sends SIGKILL after a grace period: cancel within it

# The client's own failures (documented in docs/ci-examples.md).
EXIT_USAGE = 200
EXIT_REFUSED = 201
EXIT_UNREACHABLE = 202
EXIT_TIMEOUT = 203
EXIT_PORTAL_ERROR = 204
CLIENT_CODES = frozenset({EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_TIMEOUT, EXIT_PORTAL_ERROR})


class CliError(Exception):
    """A failure of the client (not of a job) to report and exit with `code`."""

    def __init__(self, message: str, code: int = EXIT_PORTAL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP: what CI runners send when a pipeline is cancelled or times out."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


class Signals:
    """Turns SIGINT, SIGTERM and SIGHUP into Interrupted, except while held: a signal that arrives while the job
    is being submitted waits until its id is known, so the job it stands for can be cancelled."""

    def __init__(self) -> None:
        self.held = False
        self.pending: str | None = None

    def install(self, handler: Any = None) -> dict[int, Any]:
        """Set the handler (default: ours) from the main thread, the only one that may; return the old ones.
        main() puts those back, and ignores the signals while cancelling (a runner's second SIGTERM must not stop
        the cancel halfway)."""
        previous: dict[int, Any] = {}
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            if hasattr(signal, name) and threading.current_thread() is threading.main_thread():
                previous[getattr(signal, name)] = signal.signal(getattr(signal, name), handler or self._on_signal)
        return previous

    def hold(self) -> None:
        self.held = True

    def release(self) -> str | None:
        """Stop holding; the signal that arrived meanwhile, if any."""
        self.held = False
        name, self.pending = self.pending, None
        return name

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.held:
            self.pending = self.pending or name
            return
        raise Interrupted(name)


SIGNALS = Signals()


class Client:
    """Talks to the portal's REST API v1 with a bearer token; turns the error shape into CliError."""

    def __init__(self, url: str, token: str, timeout: float = TIMEOUT_S) -> None:
        self.base = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})
        self.session.headers["User-Agent"] = "gpuportal-cli/1"
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        retries: int = 3,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Retries connection errors, 429 and 5xx (POSTs only with an Idempotency-Key, so never twice), all within
        `timeout` seconds (default: the client's): a portal that accepts connections but never answers is given
        up on then, with a one-line message."""
        idempotent = method in ("GET", "HEAD") or bool(headers and "Idempotency-Key" in headers)
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        attempt = 0

        def pause(seconds: float) -> bool:
            """Sleep before the next attempt, if the budget leaves time for one."""
            if time.monotonic() + seconds >= deadline:
                return False
            time.sleep(seconds)
            return True

        while True:
            attempt += 1
            left = max(0.1, deadline - time.monotonic())
            try:
                resp = self.session.request(
                    method, f"{self.base}/api/v1{path}", timeout=(left, left), headers=headers, **kwargs
                )
            except requests.Timeout as exc:
                raise CliError(
                    f"{self.base} did not answer within {budget:g} s ({method} {path}); see --timeout", EXIT_TIMEOUT
                ) from exc
            except requests.RequestException as exc:
                if idempotent and attempt <= retries and pause(min(2**attempt, 10)):
                    continue
                raise CliError(f"cannot reach {self.base}: {_reason(exc)}", EXIT_UNREACHABLE) from exc
            in_progress = resp.status_code == 409 and _code(resp) == "idempotency_in_progress"
            if in_progress and attempt <= retries + 5 and pause(1):
                continue
            retry = (resp.status_code == 429 or resp.status_code >= 500) and idempotent and attempt <= retries
            if retry and pause(_retry_after(resp, min(2**attempt, 10))):
                continue
            if resp.status_code >= 400:
                raise CliError(_error_text(resp), EXIT_REFUSED if resp.status_code < 500 else EXIT_PORTAL_ERROR)
            if resp.status_code == 204 or not resp.content:
                return None
            try:
                return resp.json()
            except ValueError as exc:
                raise CliError(f"{self.base} answered {method} {path} with something other than JSON") from exc


def _retry_after(resp: requests.Response, default: float) -> float:
    try:
        return float(resp.headers.get("Retry-After", default))
    except ValueError:
        return default


def _reason(exc: requests.RequestException) -> str:
    """The cause in a few words ("Connection refused"), not urllib3's nested repr."""
    text = str(exc)
    found = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return str(found[-1]).strip().rstrip(".")
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return "the connection was closed without an answer"
    return type(exc).__name__


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
        # The final state is said once, after the job's last lines.
        if job["state"] != last_state and job["state"] not in TERMINAL and not quiet:
            _say(describe(job))
            last_state = job["state"]
        if job["state"] in TERMINAL:
            if ended_at is None:
                ended_at = time.monotonic()
            complete = job.get("logs_complete") and after >= job.get("log_seq", 0) and not waiting
            grace = LOG_GRACE_S + (WAITING_GRACE_S if waiting else 0.0)
            if not show_logs or complete or time.monotonic() - ended_at > grace:
                if not quiet:
                    _say(describe(job))
                return dict(job)
        time.sleep(POLL_S)


# --- Commands ---------------------------------------------------------------------------------------------------


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    if not args.argv:
        raise CliError("give the command after --, e.g. gpuportal submit --image IMG -- python train.py", EXIT_USAGE)
    env: dict[str, str] = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--env {item!r}: expected NAME=value", EXIT_USAGE)
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
        ("pool", args.pool),
    ):
        if value is not None:
            body[key] = value
    if args.model:
        models = [m for m in args.model.split(",") if m]
        body["gpu_model"] = models[0] if len(models) == 1 else models
    # One key for every retry of this submission: a lost answer never queues the job twice.
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    # A signal during the submission waits for its answer: then the job's id is known and it can be cancelled.
    SIGNALS.hold()
    try:
        job = client.request("POST", "/jobs/", json=body, headers={"Idempotency-Key": key})
    finally:
        pending = SIGNALS.release()
    if pending is not None:
        return cancel_on_signal(client, job, pending)
    if not args.wait:
        print(json.dumps(job, indent=2) if args.json else job["id"])
        return 0
    _say(f"job {job['id']} submitted: {client.base}/jobs/{job['id']}/")
    try:
        final = follow(client, int(job["id"]), show_logs=not args.no_logs)
    except Interrupted as exc:
        return cancel_on_signal(client, job, exc.signame)
    if args.json:
        print(json.dumps(final, indent=2))
    return exit_code_of(final)


def cancel_on_signal(client: Client, job: dict[str, Any], signame: str) -> int:
    """Ctrl-C, SIGTERM or SIGHUP while a job is ours: cancel it (CI runners send these when a pipeline is
    cancelled or times out; the job would otherwise keep its GPUs), say so, and exit 130."""
    SIGNALS.install(signal.SIG_IGN)
    _say(f"{signame} received: cancelling job {job['id']}")
    budget = min(client.timeout, CANCEL_TIMEOUT_S)
    deadline = time.monotonic() + budget
    now = client.request("POST", f"/jobs/{job['id']}/cancel/", timeout=budget)
    # A job on a node ends when the node has stopped it: wait for that within the budget, to say how it ended.
    try:
        while isinstance(now, dict) and now.get("state") not in TERMINAL and time.monotonic() < deadline:
            time.sleep(POLL_S)
            now = client.request("GET", f"/jobs/{job['id']}/", timeout=max(0.5, deadline - time.monotonic()))
    except CliError:
        pass  # the cancel was accepted; only the confirmation is missing
    if isinstance(now, dict) and now.get("state") in TERMINAL:
        _say(describe(now))
    else:
        _say(f"job {job['id']}: cancel accepted, the node is stopping it")
    return 130


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
            raise CliError(
                f"say which team with --team (you are in: {', '.join(map(str, teams)) or 'none'})", EXIT_USAGE
            )
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


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line exits with the client's usage code, not 2 (a job's code)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise CliError(message, EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuportal",
        description="GPU Portal client. Configure with GPUPORTAL_URL and GPUPORTAL_TOKEN.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=os.environ.get("GPUPORTAL_URL"), help="default: $GPUPORTAL_URL")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=os.environ.get("GPUPORTAL_TIMEOUT") or TIMEOUT_S,  # argparse applies `type` to a str default
        help="seconds one call to the portal may take, retries included (default: $GPUPORTAL_TIMEOUT or 30)",
    )
    parser.add_argument(
        "--client-error-code",
        type=int,
        default=None,
        metavar="N",
        help="exit with N for every failure of the client itself instead of 200-204 "
        "(default: $GPUPORTAL_CLIENT_ERROR_CODE)",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

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
    p.add_argument("--pool", help="let this pool's scheduler choose the GPUs (e.g. a Slurm pool)")
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


def _client_code(code: int, mapped: int | None) -> int:
    return mapped if mapped is not None and code in CLIENT_CODES else code


def _mapping(argv: Sequence[str]) -> int | None:
    """--client-error-code / GPUPORTAL_CLIENT_ERROR_CODE, read before argparse so that it maps its errors too."""
    value: str | None = os.environ.get("GPUPORTAL_CLIENT_ERROR_CODE") or None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--client-error-code" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--client-error-code="):
            value = arg.split("=", 1)[1]
    try:
        return None if value is None else int(value) % 256
    except ValueError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mapped = _mapping(argv)
    previous = SIGNALS.install()
    try:
        return _main(argv, mapped)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _main(argv: list[str], mapped: int | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except CliError as exc:
        _say(f"error: {exc}")
        return _client_code(exc.code, mapped)
    if getattr(args, "argv", None) and args.argv[0] == "--":
        args.argv = args.argv[1:]
    token = os.environ.get("GPUPORTAL_TOKEN", "")
    if not args.url:
        _say("set GPUPORTAL_URL (or --url) to the portal's address")
        return _client_code(EXIT_USAGE, mapped)
    if not token:
        _say("set GPUPORTAL_TOKEN to a personal API token (Settings → API tokens)")
        return _client_code(EXIT_USAGE, mapped)
    if args.timeout <= 0:
        _say("--timeout must be a positive number of seconds")
        return _client_code(EXIT_USAGE, mapped)
    client = Client(args.url, token, timeout=args.timeout)
    try:
        return int(args.run(client, args))
    except CliError as exc:
        _say(f"error: {exc}")
        return _client_code(exc.code, mapped)
    except KeyboardInterrupt as exc:
        _say(f"{getattr(exc, 'signame', 'SIGINT')} received: stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())

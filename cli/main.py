"""`gpuportal`: the GPU Portal command-line client, for CI pipelines and terminals. Needs only `requests`.

    export GPUPORTAL_URL=https://gpus.example.org GPUPORTAL_TOKEN=gpp_...
    gpuportal submit --gpus 1 --image pytorch/pytorch:2.4 --max-duration 3600 --env SEED=1 --wait -- python train.py
    gpuportal submit --share 0.25 --image IMG -- python serve.py    (or --mig-profile 1g.10gb: part of one GPU)
    gpuportal status 42          gpuportal logs 42 --follow          gpuportal cancel 42
    gpuportal gpus               gpuportal reserve --gpus 2 --model A100-80GB --start 2026-03-01T09:00 --end ...
    gpuportal reservations       gpuportal release 7     (cancel a booking, or release its GPUs now)
    gpuportal extend 7 --by 2h   (or --end 2026-03-01T19:00+01:00: a later end, or an earlier one)

`submit --wait` streams the job's output (stdout to stdout, stderr to stderr) and exits with the job's exit code:
0 succeeded; the job's own code when it failed with one; 124 timed out; 125 could not be launched; 130 cancelled
(also when Ctrl-C, SIGTERM or SIGHUP stops the client: it cancels the job first); 137 killed for memory (OOM); 75
lost with its node.
The client's own failures: 200 bad command line or configuration; 201 refused by the portal; 202 portal
unreachable; 203 no answer within --timeout; 204 portal error (docs/ci-examples.md; --client-error-code maps them).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from cli.client import TIMEOUT_S, Client
from cli.commands import (
    cmd_cancel,
    cmd_extend,
    cmd_gpus,
    cmd_logs,
    cmd_release,
    cmd_reservations,
    cmd_reserve,
    cmd_status,
    cmd_submit,
)
from cli.exits import CLIENT_CODES, EXIT_USAGE, SIGNALS, CliError
from cli.follow import say


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line exits with the client's usage code, not 2 (a job's code)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise CliError(message, EXIT_USAGE)


def share_fraction(text: str) -> float:
    """--share: a fraction of one GPU, above 0 and at most 1 (the portal's range; 1 is a shared GPU whole)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction of one GPU above 0 and at most 1 (e.g. 0.25)")
    return value


def duration_s(text: str) -> int:
    """--by: a length of time, "2h", "30m", "1h30m" or seconds ("5400"); positive."""
    match = re.fullmatch(r"\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*", text)
    if text.strip().isdigit():
        seconds = int(text)
    elif match and (match.group(1) or match.group(2)):
        seconds = int(match.group(1) or 0) * 3600 + int(match.group(2) or 0) * 60
    else:
        seconds = 0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a length of time such as 2h, 30m or 1h30m")
    return seconds


def _add_part(p: argparse.ArgumentParser) -> None:
    part = p.add_mutually_exclusive_group()
    part.add_argument("--mig-profile", metavar="PROFILE", help="a MIG instance of this profile, e.g. 1g.10gb")
    part.add_argument("--share", type=share_fraction, metavar="FRACTION", help="this part of a shared GPU, e.g. 0.25")
    part.add_argument(
        "--mig-memory", type=int, metavar="MIB", help="any MIG instance with at least this much memory (MiB)"
    )


def _check_part(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A share is of one GPU, and a job runs on one MIG instance; a booking may hold several instances."""
    if args.share is not None and args.gpus not in (None, 1):
        parser.error("--share is a part of one GPU: leave out --gpus (or give --gpus 1)")
    instance = args.mig_profile or args.mig_memory is not None
    if instance and args.gpus not in (None, 1) and args.command == "submit":
        parser.error(
            "a job runs on one MIG instance: leave out --gpus (or give --gpus 1) with --mig-profile/--mig-memory"
        )
    if args.mig_memory is not None and args.mig_memory < 1:
        parser.error("--mig-memory is the least memory of the instance in MiB: a positive whole number")
    if args.command == "reserve" and args.gpus is None and not (instance or args.share is not None):
        parser.error("the following arguments are required: --gpus (or --mig-profile / --mig-memory / --share)")


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
    _add_part(p)
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
    p.set_defaults(run=cmd_submit, parser=p)

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

    p = sub.add_parser("gpus", help="the fleet's GPUs with live utilization, MIG instances and shares")
    p.set_defaults(run=cmd_gpus)

    p = sub.add_parser("reserve", help="book GPUs, or parts of GPUs, for a time window")
    p.add_argument("--gpus", type=int, help="whole GPUs, or MIG instances with --mig-profile")
    _add_part(p)
    p.add_argument("--model")
    p.add_argument("--start", required=True, help="ISO 8601, e.g. 2026-03-01T09:00:00+01:00")
    p.add_argument("--end", required=True)
    p.add_argument("--team")
    p.add_argument("--note")
    p.set_defaults(run=cmd_reserve, parser=p)

    p = sub.add_parser("reservations", help="your teams' reservations booked or active now")
    p.add_argument("--team")
    p.add_argument("--all", action="store_true", help="ended and cancelled ones too")
    p.set_defaults(run=cmd_reservations)

    p = sub.add_parser("release", help="cancel a booking before its start, or release its GPUs now")
    p.add_argument("reservation_id", type=int)
    p.set_defaults(run=cmd_release)

    p = sub.add_parser("extend", help="move a reservation's end: later by --by, or to --end (earlier too)")
    p.add_argument("reservation_id", type=int)
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--by", type=duration_s, metavar="TIME", help="this much later: 2h, 30m, 1h30m")
    when.add_argument("--end", help="the new end, ISO 8601 (e.g. 2026-03-01T19:00:00+01:00)")
    p.set_defaults(run=cmd_extend)
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
        if "parser" in args:
            _check_part(args.parser, args)
    except CliError as exc:
        say(f"error: {exc}")
        return _client_code(exc.code, mapped)
    if getattr(args, "argv", None) and args.argv[0] == "--":
        args.argv = args.argv[1:]
    token = os.environ.get("GPUPORTAL_TOKEN", "")
    if not args.url:
        say("set GPUPORTAL_URL (or --url) to the portal's address")
        return _client_code(EXIT_USAGE, mapped)
    if not token:
        say("set GPUPORTAL_TOKEN to a personal API token (Settings → API tokens)")
        return _client_code(EXIT_USAGE, mapped)
    if args.timeout <= 0:
        say("--timeout must be a positive number of seconds")
        return _client_code(EXIT_USAGE, mapped)
    client = Client(args.url, token, timeout=args.timeout)
    try:
        return int(args.run(client, args))
    except CliError as exc:
        say(f"error: {exc}")
        return _client_code(exc.code, mapped)
    except KeyboardInterrupt as exc:
        say(f"{getattr(exc, 'signame', 'SIGINT')} received: stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())

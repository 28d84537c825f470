"""The web server: uvicorn in N processes, each accepting on a listening socket of its own (SO_REUSEPORT).

Why not `uvicorn --workers N`: its processes share one listening socket, and which of them accepts a new
connection is a race; keep-alive connections then stay where they landed. In the booking benchmark (32 keep-alive
clients, 2 processes on 2 cores) the splits were 29/3, 12/20 and 32/0 in three runs, and a run where one process
held (nearly) every connection served ~190 bookings/s instead of ~285 while the other core idled. With a socket per
process the kernel spreads new connections over the sockets by a hash of their addresses and ports, so each
process gets its share (32 connections over 2 processes: 16 ± 3), also behind a reverse proxy (one address, many
ports).

    python -m portal.serve [--host H] [--port P] [--processes N] [--ws-max-size BYTES] [--log-level L]
                           [--access-log] [--app portal.asgi:application]

`--processes` defaults to WEB_PROCESSES (1: uvicorn in this process, no supervisor); one per core is the usual
choice. Websocket compression is off and
the lifespan protocol unused, as everywhere in the portal; proxy headers are trusted from FORWARDED_ALLOW_IPS
(uvicorn's variable, default 127.0.0.1). A process that exits is started again after RESTART_DELAY_S (three
that exit right at start stop the server: the app or the port is broken); SIGTERM or SIGINT stops them all.
A stop gives open requests and websockets SHUTDOWN_GRACE_S to finish, then cancels what is left: without a bound
uvicorn waits for a consumer that does not end until it is killed (apps/core/channel_layer.py says how one did).
Linux (and other systems with SO_REUSEPORT load balancing) only.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import sys
import time
from typing import Any

RESTART_DELAY_S = 1.0
STARTUP_GRACE_S = 5.0  # a process that exits sooner than this failed to start
MAX_QUICK_FAILURES = 3
STOP_TIMEOUT_S = 15.0
SHUTDOWN_GRACE_S = 5  # whole seconds (uvicorn's timeout_graceful_shutdown); below STOP_TIMEOUT_S
WS_MAX_BYTES = 64 * 1024


def reuseport_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on (host, port) that other processes may bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM this process when its parent dies (killed with SIGKILL, it cannot stop its children), so
    no orphan keeps serving the port."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before prctl
        sys.exit(0)


def _serve(options: dict[str, Any], parent: int | None = None) -> None:
    """One server process: its own socket, uvicorn's server on it. `parent`: the supervisor's pid (a child)."""
    import uvicorn

    if parent is not None:
        _die_with_parent(parent)
    config = uvicorn.Config(
        options["app"],
        host=options["host"],
        port=options["port"],
        ws_per_message_deflate=False,
        ws_max_size=options["ws_max_size"],
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        access_log=options["access_log"],
        log_level=options["log_level"],
    )
    sock = reuseport_socket(options["host"], options["port"])
    uvicorn.Server(config).run(sockets=[sock])


def parse(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m portal.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--processes", type=int, default=int(os.environ.get("WEB_PROCESSES") or 1))
    parser.add_argument("--ws-max-size", type=int, default=WS_MAX_BYTES)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument("--app", default="portal.asgi:application")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    return vars(args)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    if options["processes"] == 1:  # nothing to balance: uvicorn in this process, as `uvicorn` itself would run
        _serve(options)
        return 0
    # Bind once here first (without listening, so no connection is queued on it): a port in use, or not ours to
    # bind, fails now with a message instead of in every child.
    family = socket.AF_INET6 if ":" in options["host"] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((options["host"], options["port"]))
        except OSError as exc:
            where = f"{options['host']}:{options['port']}"
            print(f"portal.serve: cannot listen on {where}: {exc.strerror}", file=sys.stderr)
            return 2
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: nothing of this process's state is shared
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    started: dict[int, float] = {}

    def start() -> Any:
        process = ctx.Process(target=_serve, args=(options, os.getpid()), name="portal-web", daemon=False)
        process.start()
        started[int(process.pid or 0)] = time.monotonic()
        return process

    processes = [start() for _ in range(options["processes"])]
    quick_failures, status = 0, 0
    print(
        f"portal.serve: {len(processes)} process(es) on http://{options['host']}:{options['port']} "
        f"(pids {', '.join(str(p.pid) for p in processes)})",
        flush=True,
    )
    while not stopping:
        time.sleep(0.2)
        for i, process in enumerate(processes):
            if stopping or process.is_alive():
                continue
            lived = time.monotonic() - started.pop(process.pid, 0.0)
            quick_failures = quick_failures + 1 if lived < STARTUP_GRACE_S else 0
            if quick_failures >= MAX_QUICK_FAILURES:  # it cannot start (the app, the port): restarting won't help
                print(f"portal.serve: processes keep exiting at start ({process.exitcode}); stopping", flush=True)
                stopping, status = True, 1
                break
            print(f"portal.serve: process {process.pid} exited ({process.exitcode}); starting another", flush=True)
            time.sleep(RESTART_DELAY_S)
            processes[i] = start()
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    return status


if __name__ == "__main__":
    sys.exit(main())

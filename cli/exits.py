"""How the client ends: its own exit codes, a job's exit code, and the signals that stop it (Ctrl-C, SIGTERM,
SIGHUP: what CI runners send when a pipeline is cancelled or times out)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

TERMINAL = {"succeeded", "failed", "cancelled", "lost"}
REASON_EXIT = {"timeout": 124, "launch_error": 125, "oom": 137, "node_lost": 75, "cancelled": 130, "preempted": 130}
STATE_EXIT = {"cancelled": 130, "lost": 75}

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

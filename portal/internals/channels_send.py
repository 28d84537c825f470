"""The ASGI server's own `send` under Channels' SessionMiddleware wrapper, for the fleet stream's snapshots.

The wrapper inspects the session on every message so it can save it on `http.response.start`; a websocket frame
never qualifies, and that inspection is about a tenth of the CPU of each snapshot delivered to a socket
(`bench/fleet_fanout.py`, with and without; docs/benchmarks.md). Accept and close still pass through the wrapper.
Upstream names: `channels.sessions.InstanceSessionWrapper.real_send` (private, set per connection) reached through
the bound method's `__self__`; when Channels changes it, this falls back to the wrapped send (correct, slower), and
`tests/telemetry/test_fanout.py::test_snapshot_sends_skip_only_the_session_wrapper` fails.
"""

from __future__ import annotations

from typing import Any


def server_send(send: Any) -> Any:
    """`send`'s innermost server send when Channels' session wrapper is in the way, else `send` itself."""
    inner = getattr(getattr(send, "__self__", None), "real_send", None)
    return inner if callable(inner) else send

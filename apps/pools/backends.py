"""The seam between the portal and whoever schedules a pool's GPUs.

`agents`: the portal's scheduler places jobs and its node agents run them. A bridged backend (`slurm`, later
`kubernetes`): an external scheduler places and runs them, and a bridge process beside it pulls the pool's work
from the portal, submits it there, and reports back (workers/slurm_bridge for Slurm). Adding a backend is one entry
in BACKENDS plus its bridge process; the portal side (work lists, reports, the ledger) is shared by every bridged
backend, and the agents backend is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.errors import ValidationFailed
from apps.fleet.models import PoolBackend


@dataclass(frozen=True)
class Backend:
    name: str
    # The portal's own scheduler places jobs on this pool's GPUs and sends launches to node agents.
    portal_schedules: bool
    # A bridge process submits the pool's jobs to an external scheduler and reports on them.
    bridged: bool
    # Options a pool of this backend understands (Pool.options keys), for validation and the docs.
    options: tuple[str, ...] = ()


BACKENDS: dict[str, Backend] = {
    PoolBackend.AGENTS: Backend(name=PoolBackend.AGENTS, portal_schedules=True, bridged=False),
    PoolBackend.SLURM: Backend(
        name=PoolBackend.SLURM,
        portal_schedules=False,
        bridged=True,
        options=("partition", "account_prefix", "container_flag"),
    ),
}


def backend_of(name: str) -> Backend:
    backend = BACKENDS.get(name)
    if backend is None:
        raise ValidationFailed(f"Pool backend {name!r} is not available here (known: {', '.join(sorted(BACKENDS))}).")
    return backend


def check_options(name: str, options: dict[str, object]) -> dict[str, object]:
    backend = backend_of(name)
    unknown = sorted(set(options) - set(backend.options))
    if unknown:
        raise ValidationFailed(f"Unknown options for a {name} pool: {', '.join(unknown)}.")
    return options

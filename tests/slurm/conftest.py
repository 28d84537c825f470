"""The Slurm cluster these tests drive: started once per session, skipped only where Slurm's binaries are absent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.slurm import Slurm, running_cluster, unavailable_reason


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Slurm]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_cluster: Slurm) -> Slurm:
    """The session's cluster, with slurmctld and slurmd up (a test may have restarted or stopped them)."""
    if "slurmctld" not in slurm_cluster.processes:
        slurm_cluster.start_slurmctld()
    if "slurmd" not in slurm_cluster.processes:
        slurm_cluster.start_slurmd()
    return slurm_cluster

"""Job runtimes of the node agent: Docker containers or local processes (no Django import).

``DockerRuntime`` lives in ``workers.runtimes.docker`` and ``ProcessRuntime`` in ``workers.runtimes.process``;
they are not imported here so a node without the Docker SDK can still use the process runtime.
"""

from .base import (
    JobOutcome,
    LaunchSpec,
    Mount,
    Runtime,
    RuntimeEvents,
    RuntimeJob,
)
from .policy import ContainerPolicy, PolicyViolation, validate_launch_request

__all__ = [
    "ContainerPolicy",
    "JobOutcome",
    "LaunchSpec",
    "Mount",
    "PolicyViolation",
    "Runtime",
    "RuntimeEvents",
    "RuntimeJob",
    "validate_launch_request",
]

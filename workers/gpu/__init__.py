"""GPU backends of the node agent: NVML on real nodes, a simulation elsewhere. No Django here (see base.py)."""

from __future__ import annotations

import logging

from workers.gpu.base import GpuBackend

logger = logging.getLogger(__name__)

DEFAULT_SIMULATED_MODELS = ("A100-80GB", "A100-80GB", "H100-80GB", "L40S-48GB")


def open_backend(
    kind: str = "auto",
    *,
    node_name: str,
    simulated_models: list[str] | None = None,
    seed: int = 0,
    replay_idle: bool | str = False,
) -> GpuBackend:
    """The backend the agent should use: "nvml", "simulated", or "auto" (NVML when it finds a GPU, else simulated).

    "auto" is the embedded default's choice: one command on a laptop gets simulated GPUs, the same command on a GPU
    node gets the real ones.
    """
    if kind not in ("auto", "nvml", "simulated"):
        raise ValueError(f"unknown GPU backend {kind!r}: auto, nvml or simulated")
    if kind in ("auto", "nvml"):
        from workers.gpu.nvml import NvmlBackend, NvmlUnavailable

        try:
            backend = NvmlBackend()
        except NvmlUnavailable as exc:
            if kind == "nvml":
                raise
            logger.info("no usable NVML (%s); using simulated GPUs", exc)
        else:
            if kind == "nvml" or backend.discover():
                return backend
            backend.close()
            logger.info("NVML found no GPU; using simulated GPUs")
    from workers.gpu.simulated import SimulatedBackend

    models = list(simulated_models or DEFAULT_SIMULATED_MODELS)
    return SimulatedBackend(node_name, models, seed=seed, replay_idle=replay_idle)

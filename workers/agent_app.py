"""The agent's Celery tasks, served from its own queue `node.<name>`.

Every command is a signed envelope from the portal (apps/fleet/commands.py); `verify_command` refuses anything
not signed for this node and task, or older than 10 minutes. A refused or malformed command is logged and dropped:
it never raises into Celery (no retries of something that will never be valid).

- `agent.hold_gpus` {"holds": [{"gpu_uuid", "team", "reservation_id", "until"}], "replace": false}: remember the
  holds (memory + state file) for the job runtime; `replace` makes them the whole set.
- `agent.run_probe` {"gpu_uuid"}: run the torch probe on that GPU, report `fleet.probe_result`.
- `agent.launch_job`, `agent.cancel_job`: workers/agent_jobs.py.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from workers import agent_jobs
from workers.agent_host import AgentHost, command_body
from workers.agent_jobs import JobRunner
from workers.agent_state import parse_hold

logger = logging.getLogger(__name__)


def install_tasks(app: Celery, agent: AgentHost) -> JobRunner:
    """Register the agent's tasks on its Celery app (called once, before the worker starts); returns the job
    runner that serves the job commands."""

    def hold_gpus(envelope: Any) -> int | None:
        body = command_body(agent, "agent.hold_gpus", envelope)
        if body is None:
            return None
        raw = body.get("holds")
        if not isinstance(raw, list):
            logger.warning("agent.hold_gpus refused: holds must be a list")
            return None
        holds = []
        for item in raw:
            try:
                hold = parse_hold(item)
            except ValueError as exc:
                logger.warning("agent.hold_gpus: hold %r skipped: %s", item, exc)
                continue
            if hold.gpu_uuid not in agent.gpu_by_uuid:
                logger.warning("agent.hold_gpus: GPU %s is not on this node; skipped", hold.gpu_uuid)
                continue
            holds.append(hold)
        active = agent.holds.apply(holds, replace=body.get("replace") is True)
        logger.info("holds updated: %d received, %d active", len(holds), active)
        return active

    def run_probe(envelope: Any) -> None:
        body = command_body(agent, "agent.run_probe", envelope)
        if body is None:
            return
        uuid = body.get("gpu_uuid")
        if not isinstance(uuid, str) or uuid not in agent.gpu_by_uuid:
            logger.warning("agent.run_probe refused: no GPU %r on this node", uuid)
            return
        agent.run_probe(uuid)

    # shared=False: see agent_jobs.install.
    app.task(name="agent.hold_gpus", ignore_result=True, shared=False)(hold_gpus)
    app.task(name="agent.run_probe", ignore_result=True, time_limit=900, shared=False)(run_probe)
    return agent_jobs.install(app, agent)

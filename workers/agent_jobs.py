"""Job commands of the node agent: the place for `agent.launch_job` and `agent.cancel_job` (jobs engineer).

`install(app, agent)` is called once by workers/agent_app.install_tasks, before the agent's Celery worker starts.
Register tasks on `app` (queue `node.<name>` is the default) and use from `agent`:

- `command_body(agent, "agent.launch_job", envelope)` (workers.agent_app): the verified body of a signed command,
  or None when refused (the portal signs with apps.fleet.commands.agent_send);
- `agent.link.send("jobs.<event>", {...})`: a report to the portal's `control` queue (node and token are added);
- `agent.holds.for_gpu(uuid)`: the holds booking sent (workers/agent_state.py);
- `agent.backend`, `agent.backend_kind`, `agent.gpu_by_uuid`: the GPUs (a simulated backend's `assign`/`release`
  make its telemetry follow a job);
- `agent.stop_event`: set on shutdown.

No job logic lives here yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery import Celery

if TYPE_CHECKING:
    from workers.agent import Agent


def install(app: Celery, agent: Agent) -> None:
    """Register the job tasks (none yet)."""
    return None

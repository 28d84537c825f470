"""The node agent's pieces without a broker: command signatures, holds, the tasks on its queue, CLI parsing,
and that nothing under workers/ imports Django."""

from __future__ import annotations

import ast
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from workers.agent import Agent, AgentConfig, parse_args
from workers.agent_state import HoldStore, parse_hold
from workers.gpu.simulated import SimulatedBackend
from workers.transport import CommandRejected, broker_url_for, sign_command, verify_command

TOKEN = "gpn_0123456789_" + "s" * 43
WORKERS = Path(__file__).resolve().parents[2] / "workers"


def test_nothing_under_workers_imports_django() -> None:
    for path in WORKERS.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("django", "rest_framework", "apps", "portal")), f"{path}: {name}"


def test_portal_and_agent_sign_the_same_bytes() -> None:
    from apps.accounts import tokens
    from apps.fleet.commands import sign_command as portal_sign

    body = {"holds": [{"gpu_uuid": "GPU-1", "until": "2026-12-01T00:00:00+00:00"}], "x": 1.5}
    envelope = portal_sign(node_name="n1", token_digest=tokens.digest_of(TOKEN), task="agent.hold_gpus", body=body)
    assert verify_command(envelope, node="n1", token=TOKEN, task="agent.hold_gpus") == body
    assert json.loads(json.dumps(envelope)) == envelope  # survives the JSON serializer


@pytest.mark.parametrize(
    "tamper",
    [
        lambda e: e.update(node="n2"),
        lambda e: e.update(task="agent.run_probe"),
        lambda e: e.update(body={"holds": [1]}),
        lambda e: e.update(sig="0" * 64),
        lambda e: e.pop("sig"),
        lambda e: e.update(ts=e["ts"] - 3600),
        lambda e: e.update(v=2),
    ],
)
def test_a_tampered_or_foreign_command_is_refused(tamper) -> None:
    envelope = sign_command(node="n1", token=TOKEN, task="agent.hold_gpus", body={"holds": []})
    tamper(envelope)
    with pytest.raises(CommandRejected):
        verify_command(envelope, node="n1", token=TOKEN, task="agent.hold_gpus")


def test_old_commands_are_refused() -> None:
    envelope = sign_command(node="n1", token=TOKEN, task="t", body={}, ts=time.time() - 601)
    with pytest.raises(CommandRejected):
        verify_command(envelope, node="n1", token=TOKEN, task="t")


def test_broker_urls() -> None:
    assert broker_url_for("unix:///run/r.sock?db=4") == "redis+socket:///run/r.sock?virtual_host=4"
    assert broker_url_for("redis://h:6379/2") == "redis://h:6379/2"


def _hold(uuid: str = "GPU-1", rid: int = 1, minutes: int = 60) -> dict:
    until = (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()
    return {"gpu_uuid": uuid, "team": "vision", "reservation_id": rid, "until": until}


def test_holds_persist_and_expire(tmp_path: Path) -> None:
    path = tmp_path / "holds.json"
    store = HoldStore(path)
    assert store.apply([parse_hold(_hold("GPU-1", 1)), parse_hold(_hold("GPU-2", 2, minutes=-1))]) == 1
    again = HoldStore(path)
    [hold] = again.active()
    assert (hold.gpu_uuid, hold.team, hold.reservation_id) == ("GPU-1", "vision", 1)
    assert again.for_gpu("GPU-1") == [hold] and again.for_gpu("GPU-2") == []
    assert again.apply([parse_hold(_hold("GPU-3", 3))], replace=True) == 1
    assert [h.gpu_uuid for h in HoldStore(path).active()] == ["GPU-3"]


@pytest.mark.parametrize(
    "bad",
    [
        {"gpu_uuid": "", "team": "t", "reservation_id": 1, "until": "2026-01-01T00:00:00+00:00"},
        {"gpu_uuid": "G", "team": "t", "reservation_id": "1", "until": "2026-01-01T00:00:00+00:00"},
        {"gpu_uuid": "G", "team": "t", "reservation_id": 1, "until": "2026-01-01T00:00:00"},
        {"gpu_uuid": "G", "team": "t", "reservation_id": 1, "until": "tomorrow"},
        "hold",
    ],
)
def test_bad_holds_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        parse_hold(bad)


def test_an_unreadable_state_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "holds.json"
    path.write_text("{not json")
    assert HoldStore(path).active() == []


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    cfg = AgentConfig(name="n1", token=TOKEN, broker="redis://127.0.0.1:1/0", state_dir=tmp_path, gpus=2)
    backend = SimulatedBackend("n1", ["A100-80GB", "H100-80GB"], seed=1)
    return Agent(cfg, backend=backend, backend_kind="simulated")


def test_two_agents_in_one_process_each_run_their_own_job_tasks(tmp_path: Path, monkeypatch) -> None:
    agents = []
    for name in ("n1", "n2"):
        cfg = AgentConfig(name=name, token=TOKEN, broker="redis://127.0.0.1:1/0", state_dir=tmp_path / name, gpus=2)
        agents.append(Agent(cfg, backend=SimulatedBackend(name, ["A100-80GB"], seed=1), backend_kind="simulated"))
    launched: dict[str, list[int]] = {"n1": [], "n2": []}
    for agent in agents:
        name = agent.cfg.name
        monkeypatch.setattr(agent.job_runner, "launch", lambda body, name=name: launched[name].append(body["job_id"]))
    for agent, job_id in zip(agents, (7, 8), strict=True):
        task = agent.app.tasks["agent.launch_job"]
        task(sign_command(node=agent.cfg.name, token=TOKEN, task="agent.launch_job", body={"job_id": job_id}))
    assert launched == {"n1": [7], "n2": [8]}


def test_hold_gpus_task_keeps_this_nodes_holds(agent: Agent, tmp_path: Path) -> None:
    uuids = [g.uuid for g in agent.gpus]
    body = {"holds": [_hold(uuids[0], 5), _hold("GPU-elsewhere", 6), {"gpu_uuid": uuids[1]}]}
    task = agent.app.tasks["agent.hold_gpus"]
    assert task(sign_command(node="n1", token=TOKEN, task="agent.hold_gpus", body=body)) == 1
    assert [h.reservation_id for h in agent.holds.active()] == [5]
    assert json.loads((tmp_path / "holds.json").read_text())["holds"][0]["gpu_uuid"] == uuids[0]
    # Unsigned, or signed by someone else: ignored.
    assert task({**body, "node": "n1"}) is None
    assert task(sign_command(node="n1", token=TOKEN + "x", task="agent.hold_gpus", body=body)) is None
    assert len(agent.holds.active()) == 1


def test_run_probe_task_reports_the_result(agent: Agent, monkeypatch) -> None:
    reported = []
    monkeypatch.setattr(agent.link, "send", lambda task, body, **kw: reported.append((task, body)))

    class Done:
        returncode = 0
        stdout = json.dumps({"comparison": "n/a", "degraded": False, "notes": []})
        stderr = ""

    calls = []
    monkeypatch.setattr("workers.agent.subprocess.run", lambda argv, **kw: calls.append((argv, kw)) or Done())
    uuid = agent.gpus[1].uuid
    agent.app.tasks["agent.run_probe"](
        sign_command(node="n1", token=TOKEN, task="agent.run_probe", body={"gpu_uuid": uuid})
    )
    [(task, body)] = reported
    assert task == "fleet.probe_result" and body["gpu_uuid"] == uuid
    assert body["result"]["comparison"] == "n/a" and "simulated GPU" in body["result"]["notes"][0]
    assert calls[0][0][-3:] == ["--device", "cpu", "--json"]
    # A probe for a GPU that is not ours is refused before anything runs.
    agent.app.tasks["agent.run_probe"](
        sign_command(node="n1", token=TOKEN, task="agent.run_probe", body={"gpu_uuid": "GPU-x"})
    )
    assert len(calls) == 1


def test_a_probe_that_cannot_run_reports_the_error(agent: Agent, monkeypatch) -> None:
    reported = []
    monkeypatch.setattr(agent.link, "send", lambda task, body, **kw: reported.append(body))

    class Failed:
        returncode = 2
        stdout = ""
        stderr = "probe unavailable: no torch"

    monkeypatch.setattr("workers.agent.subprocess.run", lambda argv, **kw: Failed())
    agent.run_probe(agent.gpus[0].uuid)
    assert reported[0]["error"] == "probe unavailable: no torch" and "result" not in reported[0]


def test_registration_describes_the_gpus(agent: Agent) -> None:
    reg = agent.registration()
    assert [g["model"] for g in reg["gpus"]] == ["A100-80GB", "H100-80GB"]
    assert reg["backend"] == "simulated" and reg["agent_version"]
    from apps.fleet.messages import check_registration

    check_registration({"node": "n1", "token": TOKEN, **reg})  # what the agent sends, the portal accepts


def test_cli_parsing(monkeypatch) -> None:
    monkeypatch.setenv("GPUPORTAL_NODE_TOKEN", TOKEN)
    cfg, level = parse_args(
        ["--name", "n1", "--broker", "redis://x/1", "--gpus", "3", "--models", "H100-80GB,L40S-48GB"]
    )
    assert (cfg.token, cfg.gpus, cfg.models, cfg.heartbeat_s, level) == (
        TOKEN,
        3,
        ("H100-80GB", "L40S-48GB"),
        5.0,
        "INFO",
    )
    with pytest.raises(SystemExit):
        parse_args(["--name", "n1", "--broker", "redis://x/1", "--models", "GTX-280"])
    monkeypatch.delenv("GPUPORTAL_NODE_TOKEN")
    with pytest.raises(SystemExit):
        parse_args(["--name", "n1", "--broker", "redis://x/1"])


def test_the_demos_background_loads_run_on_the_gpus_named_never_on_its_split_gpu(monkeypatch) -> None:
    from apps.fleet.demo import SHARED_INDEX
    from portal.launcher import LOCAL_AGENT_BUSY, LOCAL_AGENT_MODELS
    from workers.agent import choose_backend

    monkeypatch.setenv("GPUPORTAL_NODE_TOKEN", TOKEN)
    base = ["--name", "local", "--broker", "redis://x/1", "--backend", "simulated", "--models", LOCAL_AGENT_MODELS]
    cfg, _ = parse_args([*base, "--simulate-busy-gpus", LOCAL_AGENT_BUSY])
    assert cfg.simulate_busy_gpus == (0, 1, 6) and SHARED_INDEX not in cfg.simulate_busy_gpus
    backend, _ = choose_backend(cfg)
    assert isinstance(backend, SimulatedBackend)
    first = {s.uuid: s for s in backend.sample(time.time())}
    later = backend.sample(time.time() + 30)  # the loads ramp up from their start
    loaded = {g.index for g in backend.discover() for s in later if s.uuid == g.uuid and s.memory_used_mib > 1024}
    assert loaded == {0, 1, 6} and len(first) == 8
    # Each load runs as its uid: bob's, carol's (the demo's Unix accounts) and one no portal user has.
    from apps.identity.demo import DEMO_UIDS

    index = {g.uuid: g.index for g in backend.discover()}
    listed = [s for t in range(0, 60, 5) for s in backend.sample(time.time() + 30 + t) if s.processes]
    owners = {index[s.uuid]: backend.uid_of_pid(pid) for s in listed for pid, _ in s.processes or ()}
    assert owners == {0: DEMO_UIDS["bob"], 1: DEMO_UIDS["carol"], 6: 1500}
    assert cfg.simulate_busy_uids == ((0, 1002), (1, 1003), (6, 1500))
    cfg, _ = parse_args([*base, "--simulate-busy", "2"])
    assert choose_backend(cfg)[0].sample(time.time() + 30) and cfg.simulate_busy_gpus == ()
    for bad in ("0,x", "9", "0:root", "0:0"):
        with pytest.raises(SystemExit):
            parse_args([*base, "--simulate-busy-gpus", bad])


def test_telemetry_backlog_drops_the_oldest(agent: Agent) -> None:
    for seq in range(10):
        agent.link.telemetry({"type": "telemetry", "seq": seq})
    assert agent.link.pending() == 5 and agent.link.stats.dropped_telemetry == 5


def test_the_agents_telemetry_names_the_jobs_on_its_gpus(agent: Agent) -> None:
    # The agent wires its job runner's jobs into the sampler: the simulated load of job 5 comes back as job 5's.
    assert isinstance(agent.backend, SimulatedBackend)
    agent.backend.assign(agent.gpus[1].uuid, "job-5", "const:50:0.25")
    sent: list[dict[str, object]] = []
    agent.sampler.send = sent.append
    agent.sampler._tick(time.time())  # the first tick reads the processes
    rows = {row[0]: row for row in sent[0]["g"]}  # type: ignore[attr-defined]
    assert [entry[0] for entry in rows[agent.gpus[1].uuid][-1]["j"]] == [5]
    assert rows[agent.gpus[0].uuid][-1]["p"] == [] and "j" not in rows[agent.gpus[0].uuid][-1]  # read, no job
    assert len(rows[agent.gpus[1].uuid][-1]["j"][0]) == 3  # with the job's SM activity


def test_an_agent_whose_shares_run_under_mps_sends_no_per_process_activity(tmp_path: Path, monkeypatch) -> None:
    # Under MPS NVML may count the clients' work to the MPS server's process: the jobs' figures are left out rather
    # than sent as 0% (idle reclaim would take a busy job for an idle one).
    monkeypatch.setenv("GPUPORTAL_MPS", "1")
    monkeypatch.setenv("GPUPORTAL_RUNTIME", "process")
    cfg = AgentConfig(name="n1", token=TOKEN, broker="redis://127.0.0.1:1/0", state_dir=tmp_path, gpus=1)
    agent = Agent(cfg, backend=SimulatedBackend("n1", ["A100-80GB"], seed=1), backend_kind="simulated")
    assert isinstance(agent.backend, SimulatedBackend)
    agent.backend.assign(agent.gpus[0].uuid, "job-5", "const:50:0.25")
    sent: list[dict[str, object]] = []
    agent.sampler.send = sent.append
    agent.sampler._tick(time.time())
    ((job, mib),) = sent[0]["g"][0][-1]["j"]  # type: ignore[index]
    assert job == 5 and mib > 0


def test_a_mig_layout_changed_under_the_agent_is_registered_at_once(tmp_path: Path, monkeypatch) -> None:
    cfg = AgentConfig(name="n1", token=TOKEN, broker="redis://127.0.0.1:1/0", state_dir=tmp_path, gpus=2)
    backend = SimulatedBackend("n1", ["A100-80GB:mig=1g.10gb*7", "A100-80GB"], seed=1)
    agent = Agent(cfg, backend=backend, backend_kind="simulated")
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(agent.link, "send", lambda task, body, **kw: sent.append((task, body)))
    before = {d["uuid"] for d in agent.registration()["gpus"][0]["mig_devices"]}
    assert agent.check_layout() is False and sent == []
    parent = agent.gpus[0].uuid
    made = backend.set_layout(parent, "3g.40gb+4g.40gb")  # what an admin's mig-parted does
    assert agent.check_layout() is True
    ((task, body),) = sent
    assert task == "fleet.register"
    reported = body["gpus"][0]["mig_devices"]
    assert sorted(d["profile"] for d in reported) == ["3g.40gb", "4g.40gb"]
    assert {d["uuid"] for d in reported} == {d.uuid for d in made} and not before & {d.uuid for d in made}
    assert set(agent.gpu_by_uuid) == {g.uuid for g in agent.gpus}
    assert agent.check_layout() is False and len(sent) == 1
    from apps.fleet.messages import check_registration

    check_registration({"node": "n1", "token": TOKEN, **body})  # the portal accepts the new layout

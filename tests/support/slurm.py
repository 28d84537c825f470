"""A throwaway single-host Slurm for tests, from Debian's packages (22.05), started by hand.

Everything lives under one temp dir: munged with its own key and socket, slurmdbd on the local MariaDB server
(its own database, dropped at the end), slurmctld and one slurmd whose GPUs are fake (``AutoDetect=off``,
``File=/dev/ttyN``, ``SlurmdParameters=config_overrides`` so the node may claim more than the host has). Commands
find this cluster through ``SLURM_CONF`` (``Slurm.env``). Ports are picked free, so runs do not collide.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "slurmdbd", "sbatch", "sacctmgr", "scontrol", "squeue", "sacct", "mysql")
MYSQL_HOST = os.environ.get("PORTAL_TEST_MYSQL_HOST", "127.0.0.1")
MYSQL_PORT = int(os.environ.get("PORTAL_TEST_MYSQL_PORT", "3306"))
MYSQL_USER = os.environ.get("PORTAL_TEST_MYSQL_USER", "root")
NODE_NAME = "gpu-sim-1"
# Defined but never started (State=FUTURE: not in sinfo, not in a partition): a second node a reservation can name.
SPARE_NODE = "gpu-sim-2"
PARTITION = "gpu"
GPU_TYPE = "a100"
GPU_COUNT = 4
FIRST_TTY = 20


class SlurmError(RuntimeError):
    """Slurm is installed but a daemon did not come up (the message names the log to read)."""


def unavailable_reason() -> str | None:
    """Why a local Slurm cannot be started here, or None if it can."""
    missing = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return f"Slurm test cluster needs {', '.join(missing)} (apt-get install slurm-wlm slurmdbd munge)"
    if os.geteuid() != 0:
        return "the Slurm test cluster runs its daemons as root (SlurmUser=root)"
    if not all(os.path.exists(f"/dev/tty{FIRST_TTY + i}") for i in range(GPU_COUNT)):
        return f"fake GPUs need /dev/tty{FIRST_TTY}..{FIRST_TTY + GPU_COUNT - 1}"
    try:
        _mysql("SELECT 1")
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"slurmdbd needs MariaDB on {MYSQL_HOST}:{MYSQL_PORT} ({exc})"
    return None


def _mysql(sql: str) -> None:
    subprocess.run(
        ["mysql", "-h", MYSQL_HOST, "-P", str(MYSQL_PORT), "-u", MYSQL_USER, "-e", sql],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _daemon(path: str) -> str:
    return shutil.which(path) or f"/usr/sbin/{path}"


@dataclass
class Slurm:
    """A running cluster; ``run`` calls a Slurm command against it."""

    root: Path
    cluster: str
    database: str
    ctld_port: int
    slurmd_port: int
    dbd_port: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    partition: str = PARTITION
    node: str = NODE_NAME
    gpu_type: str = GPU_TYPE
    gpu_count: int = GPU_COUNT

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm commands (and for a bridge process) aimed at this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        # Clients authenticate with the cluster's own munged (slurm.conf's AuthInfo says the same).
        env["MUNGE_SOCKET"] = str(self.munge_socket)
        return env

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- daemons -------------------------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        out = open(self.root / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 - kept open for the child's life
        self.processes[name] = subprocess.Popen(
            list(argv), env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()

    def start_munged(self) -> None:
        m = self.root / "munge"
        subprocess.run(
            [
                _daemon("munged"),
                f"--socket={m / 'munge.socket'}",
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
                "--force",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        _wait(lambda: self.munge_socket.exists(), "munged", self)

    def start_slurmdbd(self) -> None:
        # slurmdbd has no -f: it reads slurmdbd.conf next to $SLURM_CONF.
        self._spawn("slurmdbd", [_daemon("slurmdbd"), "-D"])
        _wait(lambda: _port_open(self.dbd_port), "slurmdbd", self)

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", [_daemon("slurmctld"), "-D", "-f", str(self.conf)])
        _wait(lambda: self.run("scontrol", "ping", check=False).stdout.find("UP") >= 0, "slurmctld", self)

    def start_slurmd(self) -> None:
        self._spawn("slurmd", [_daemon("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
        _wait(self._node_ready, "slurmd", self)

    def _node_ready(self) -> bool:
        out = self.run("sinfo", "-h", "-n", self.node, "-o", "%t", check=False).stdout.strip()
        if out.startswith(("down", "drain", "drng")):
            # A node seen before a restart may come back "down" with reason "Node unexpectedly rebooted".
            self.run("scontrol", "update", f"nodename={self.node}", "state=resume", check=False)
        return out in {"idle", "mix", "alloc", "comp"}

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.processes.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def restart_slurmctld(self) -> None:
        self.stop("slurmctld")
        self.start_slurmctld()

    # -- accounts ------------------------------------------------------------------------------------------------

    def add_account(self, name: str, users: Sequence[str] = ("root",)) -> None:
        """An account (the portal's team) with associations for ``users``; idempotent."""
        existing = self.run("sacctmgr", "-n", "-P", "show", "account", name, "format=account", check=False)
        if name not in existing.stdout.split():
            self.run("sacctmgr", "-i", "add", "account", name, f"cluster={self.cluster}", f"description={name}")
        for user in users:
            self.run("sacctmgr", "-i", "add", "user", user, f"account={name}", f"cluster={self.cluster}", check=False)

    def wait_job(self, job_id: str, states: set[str], timeout: float = 60) -> dict[str, object]:
        """Wait until ``sacct`` shows the job in one of ``states``; returns its JSON record."""
        deadline = time.monotonic() + timeout
        last: dict[str, object] = {}
        while time.monotonic() < deadline:
            out = self.run("sacct", "-j", job_id, "--json", check=False).stdout
            jobs = json.loads(out).get("jobs", []) if out.strip() else []
            if jobs:
                last = jobs[0]
                state = last.get("state", {})
                current = state.get("current") if isinstance(state, dict) else None
                if current in states:
                    return last
            time.sleep(0.3)
        raise AssertionError(f"slurm job {job_id} never reached {states}: {last.get('state')}")

    def shutdown(self) -> None:
        for name in ("slurmd", "slurmctld", "slurmdbd"):
            self.stop(name)
        pid_file = self.root / "munge" / "munged.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        with contextlib.suppress(OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
            _mysql(f"DROP DATABASE IF EXISTS `{self.database}`")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(ready: object, name: str, slurm: Slurm, timeout: float = 60) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = slurm.processes.get(name)
        if proc is not None and proc.poll() is not None:
            break
        if ready():
            return
        time.sleep(0.2)
    raise SlurmError(f"{name} did not come up; log:\n{slurm.log(name)[-3000:]}")


def write_config(root: Path) -> Slurm:
    suffix = secrets.token_hex(4)
    slurm = Slurm(
        root=root,
        cluster=f"portal{suffix}",
        database=f"slurm_acct_portal_{suffix}",
        ctld_port=_free_port(),
        slurmd_port=_free_port(),
        dbd_port=_free_port(),
    )
    for sub in ("etc", "munge", "log", "state", "spool", "run"):
        (root / sub).mkdir(mode=0o700)
    (root / "munge").chmod(0o755)  # clients reach the socket through it
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    auth = f"AuthInfo=socket={slurm.munge_socket}"
    log = root / "log"
    dbd_conf = root / "etc" / "slurmdbd.conf"
    dbd_conf.write_text(
        "\n".join(
            [
                "AuthType=auth/munge",
                auth,
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={slurm.dbd_port}",
                "SlurmUser=root",
                f"LogFile={log / 'slurmdbd.log'}",
                f"PidFile={root / 'run' / 'slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql",
                f"StorageHost={MYSQL_HOST}",
                f"StoragePort={MYSQL_PORT}",
                f"StorageUser={MYSQL_USER}",
                f"StorageLoc={slurm.database}",
                "DebugLevel=info",
                "",
            ]
        )
    )
    dbd_conf.chmod(0o600)
    ttys = f"/dev/tty[{FIRST_TTY}-{FIRST_TTY + GPU_COUNT - 1}]"
    (root / "etc" / "gres.conf").write_text(
        f"AutoDetect=off\nNodeName={NODE_NAME} Name=gpu Type={GPU_TYPE} File={ttys}\n"
    )
    slurm.conf.write_text(
        "\n".join(
            [
                f"ClusterName={slurm.cluster}",
                "SlurmctldHost=localhost(127.0.0.1)",
                f"SlurmctldPort={slurm.ctld_port}",
                f"SlurmdPort={slurm.slurmd_port}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                auth,
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
                f"SlurmctldLogFile={log / 'slurmctld.log'}",
                f"SlurmdLogFile={log / 'slurmd.log'}",
                "SlurmctldDebug=info",
                "SlurmdDebug=info",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                # Without a default every job asks for the whole node's memory and they run one at a time.
                "DefMemPerCPU=100",
                "SchedulerType=sched/backfill",
                "GresTypes=gpu",
                "SlurmdParameters=config_overrides",
                "ReturnToService=2",
                "MpiDefault=none",
                "JobAcctGatherType=jobacct_gather/linux",
                "JobAcctGatherFrequency=5",
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=localhost",
                # Clients reach slurmdbd with the munged named here, not the AuthInfo one (slurm.conf(5)).
                f"AccountingStoragePass={slurm.munge_socket}",
                f"AccountingStoragePort={slurm.dbd_port}",
                "AccountingStorageEnforce=associations,limits,safe",
                "AccountingStorageTRES=gres/gpu",
                # The bridge finds a job it submitted before a restart by its comment (the portal job id).
                "AccountingStoreFlags=job_comment",
                "JobCompType=jobcomp/none",
                # Short timers keep the tests quick: a timed-out job is killed soon after its limit.
                "KillWait=2",
                "OverTimeLimit=0",
                "MinJobAge=300",
                "InactiveLimit=0",
                "MessageTimeout=10",
                "SlurmctldTimeout=30",
                "SlurmdTimeout=60",
                f"NodeName={NODE_NAME} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 CPUs=8 "
                f"RealMemory=16000 Gres=gpu:{GPU_TYPE}:{GPU_COUNT} State=UNKNOWN",
                f"NodeName={SPARE_NODE} NodeAddr=127.0.0.2 CPUs=8 RealMemory=16000 State=FUTURE",
                f"PartitionName={PARTITION} Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    return slurm


def start_cluster(root: Path) -> Slurm:
    slurm = write_config(root)
    try:
        slurm.start_munged()
        slurm.start_slurmdbd()
        # slurmctld registers the cluster with slurmdbd on start; sacctmgr needs the cluster row first.
        slurm.run("sacctmgr", "-i", "add", "cluster", slurm.cluster)
        slurm.start_slurmctld()
        slurm.start_slurmd()
    except BaseException:
        slurm.shutdown()
        raise
    return slurm


@contextlib.contextmanager
def running_cluster() -> Iterator[Slurm]:
    root = Path(tempfile.mkdtemp(prefix="portal-slurm-"))
    root.chmod(0o711)  # munged wants its socket's directories searchable by all
    slurm = start_cluster(root)
    try:
        yield slurm
    finally:
        slurm.shutdown()
        if os.environ.get("PORTAL_TEST_KEEP_SLURM") is None:
            shutil.rmtree(root, ignore_errors=True)

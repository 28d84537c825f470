"""Slurm's commands and their output, read as JSON (`--json`, Slurm 21.08 and later) or as text before that.

Every call may fail while slurmctld restarts: callers get SlurmUnavailable and try again on their next poll, never
conclude that a job is gone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON_SINCE = (21, 8)  # squeue/sinfo/sacct --json
# sacct --json before 23.02 reports every job's exit_code as SUCCESS/0 (the text ExitCode is right): accounting is
# read as text before that version.
ACCOUNTING_JSON_SINCE = (23, 2)
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
     "DEADLINE", "REVOKED"}
)  # fmt: skip
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING"})
COMMENT_PREFIX = "portal-job-"
_IDX = re.compile(r"gpu(?::([\w.-]+))?:(\d+)\(IDX:([\d,\-]+)\)")


class SlurmUnavailable(RuntimeError):
    """A Slurm command failed in a way worth retrying (controller down, timeout)."""


class SlurmRefused(RuntimeError):
    """Slurm refused the request (its words are the message)."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    hostname: str
    state: str
    gpus: Sequence[tuple[str, int]]  # (type, count) from the node's Gres
    partitions: Sequence[str] = ()

    @property
    def up(self) -> bool:
        return not any(s in self.state.lower() for s in ("down", "drain", "fail", "not_responding", "unknown"))


@dataclass
class SlurmJob:
    job_id: str
    state: str
    comment: str = ""
    node: str = ""
    gpu_indexes: list[int] = field(default_factory=list)
    start_time: int | None = None
    end_time: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    alloc_tres: dict[str, float] = field(default_factory=dict)
    account: str = ""
    elapsed_s: int | None = None


def parse_version(text: str) -> tuple[int, int]:
    m = re.search(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def expand_indexes(spec: str) -> list[int]:
    """'0-1,3' -> [0, 1, 3]."""
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def gres_indexes(details: Iterable[str]) -> list[int]:
    out: list[int] = []
    for detail in details:
        for m in _IDX.finditer(detail):
            out.extend(expand_indexes(m.group(3)))
    return out


def parse_gres(gres: str) -> list[tuple[str, int]]:
    """A node's Gres string ('gpu:a100:4(S:0),gpu:v100:2') as [(type, count)]."""
    out = []
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        kind = parts[1] if len(parts) == 3 else "gpu"
        if count.isdigit():
            out.append((kind, int(count)))
    return out


def parse_tres(text: str) -> dict[str, float]:
    """'cpu=1,mem=100M,gres/gpu=2' -> {'cpu': 1, 'gres/gpu': 2, ...} (memory and units left as numbers)."""
    out: dict[str, float] = {}
    for item in text.split(","):
        if "=" not in item:
            continue
        key, value = item.split("=", 1)
        m = re.match(r"[\d.]+", value)
        if m:
            out[key] = float(m.group(0))
    return out


def _state_of(raw: Any) -> str:
    if isinstance(raw, dict):  # sacct: {"current": "COMPLETED", "reason": ...}
        raw = raw.get("current", "")
    if isinstance(raw, list):  # later versions: ["COMPLETED"]
        raw = raw[0] if raw else ""
    return str(raw or "").split()[0] if raw else ""


def _number(raw: Any) -> int | None:
    if isinstance(raw, dict):  # 23.02+: {"set": true, "number": N}
        return int(raw["number"]) if raw.get("set", True) and raw.get("number") is not None else None
    return int(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None


class Slurm:
    """Slurm's client commands for one partition, with the environment they need (SLURM_CONF)."""

    def __init__(self, *, partition: str = "", env: Mapping[str, str] | None = None, timeout_s: float = 30) -> None:
        self.partition = partition
        self.env = dict(env if env is not None else os.environ)
        self.timeout_s = timeout_s
        self._version: tuple[int, int] | None = None
        self._hostnames: dict[str, tuple[str, ...]] = {}

    def _run(self, argv: Sequence[str], *, refuse_on_error: bool = False, env: Mapping[str, str] = {}) -> str:
        try:
            done = subprocess.run(
                list(argv), env={**self.env, **env}, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmUnavailable(f"{argv[0]}: {exc}") from exc
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip()
            if refuse_on_error and "Unable to contact" not in words and "Socket timed out" not in words:
                raise SlurmRefused(words)
            raise SlurmUnavailable(f"{argv[0]} exited {done.returncode}: {words}")
        return done.stdout

    @property
    def version(self) -> tuple[int, int]:
        if self._version is None:
            self._version = parse_version(self._run(["sinfo", "--version"]))
        return self._version

    @property
    def json(self) -> bool:
        return self.version >= JSON_SINCE and os.environ.get("SLURM_BRIDGE_TEXT") is None

    def version_text(self) -> str:
        return f"slurm {self.version[0]}.{self.version[1]:02d}"

    # -- nodes -------------------------------------------------------------------------------------------------

    def nodes(self) -> list[SlurmNode]:
        part = ["-p", self.partition] if self.partition else []
        if self.json:
            data = json.loads(self._run(["sinfo", "--json", *part]))
            out = []
            for n in data.get("nodes", []):
                if self.partition and self.partition not in n.get("partitions", []):
                    continue
                state = _state_of(n.get("state")) + " " + " ".join(n.get("state_flags") or [])
                out.append(
                    SlurmNode(
                        name=n["name"], hostname=n.get("hostname") or n["name"], state=state.strip(),
                        gpus=parse_gres(n.get("gres") or ""), partitions=tuple(n.get("partitions") or ()),
                    )
                )  # fmt: skip
            return out
        text = self._run(["sinfo", "-h", "-N", *part, "-o", "%N|%n|%T|%G|%P"])
        seen: dict[str, SlurmNode] = {}
        for line in text.splitlines():
            name, host, state, gres, partition = (line.split("|") + [""] * 5)[:5]
            seen.setdefault(name, SlurmNode(name, host or name, state, parse_gres(gres), (partition.rstrip("*"),)))
        return list(seen.values())

    # -- jobs --------------------------------------------------------------------------------------------------

    def submit(self, *, script: str, account: str, gres: str, minutes: int, comment: str, output: str,
               name: str, cpus: int, memory_mib: int, reservation: str = "") -> str:  # fmt: skip
        argv = ["sbatch", "--parsable", f"--account={account}", f"--gres={gres}", f"--time={minutes}"]
        argv += [f"--comment={comment}", f"--output={output}", f"--job-name={name}", f"--cpus-per-task={cpus}"]
        argv += [f"--mem={memory_mib}M", "--no-requeue"]
        if reservation:
            argv.append(f"--reservation={reservation}")
        if self.partition:
            argv.append(f"--partition={self.partition}")
        done = subprocess.run(argv, env=self.env, input=script, capture_output=True, text=True, timeout=self.timeout_s)
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip()
            if "Unable to contact" in words or "Socket timed out" in words or "Connection refused" in words:
                raise SlurmUnavailable(words)
            raise SlurmRefused(words.removeprefix("sbatch: error: "))
        return done.stdout.strip().split(";")[0]

    def reservations(self) -> dict[str, dict[str, str]]:
        """Slurm's reservations by name, each as its `Key=Value` fields (scontrol's text: 22.05 has no --json)."""
        text = self._run(["scontrol", "show", "reservation", "--oneliner"])
        out: dict[str, dict[str, str]] = {}
        for line in text.splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if "ReservationName" in fields:
                out[fields["ReservationName"]] = fields
        return out

    def create_reservation(self, *, name: str, start: str, end: str, account: str, nodes: Sequence[str]) -> None:
        """Slurm before 23.02 cannot reserve GRES (`TRES=gres/gpu` is refused): the nodes holding the GPUs are
        reserved, for the team's account."""
        argv = ["scontrol", "create", "reservation", f"ReservationName={name}", f"StartTime={start}"]
        argv += [f"EndTime={end}", f"Accounts={account}", f"Nodes={','.join(nodes)}"]
        self._run(argv, refuse_on_error=True)

    def move_reservation(self, *, name: str, nodes: Sequence[str]) -> None:
        """Point a reservation at other nodes (the portal moved the booking): Slurm refuses nodes another
        reservation or a running job already holds, like a new one."""
        self._run(["scontrol", "update", f"ReservationName={name}", f"Nodes={','.join(nodes)}"], refuse_on_error=True)

    def set_reservation_end(self, *, name: str, end: str) -> None:
        """Move a reservation's end (the booking was extended or shortened in the portal)."""
        self._run(["scontrol", "update", f"ReservationName={name}", f"EndTime={end}"], refuse_on_error=True)

    def hostnames(self, hostlist: str) -> tuple[str, ...]:
        """The node names of a Slurm hostlist (`gpu-[1-3],cpu-9`), expanded by Slurm itself: its syntax has ranges,
        zero padding and several bracket groups. Remembered, since the same few lists come back every poll."""
        if "[" not in hostlist and "," not in hostlist:
            return (hostlist,) if hostlist else ()
        if hostlist not in self._hostnames:
            if len(self._hostnames) > 4096:
                self._hostnames.clear()
            self._hostnames[hostlist] = tuple(self._run(["scontrol", "show", "hostnames", hostlist]).split())
        return self._hostnames[hostlist]

    def delete_reservation(self, name: str) -> None:
        self._run(["scontrol", "delete", f"ReservationName={name}"])

    def cancel(self, job_id: str) -> None:
        self._run(["scancel", job_id])

    def queue(self) -> dict[str, SlurmJob]:
        """Jobs slurmctld still holds (pending, running, and recently ended), by id."""
        if self.json:
            data = json.loads(self._run(["squeue", "--json"]))
            out = {}
            for j in data.get("jobs", []):
                job = SlurmJob(
                    job_id=str(j["job_id"]), state=_state_of(j.get("job_state")), comment=j.get("comment") or "",
                    node=(j.get("nodes") or "") if "," not in (j.get("nodes") or "") else j["nodes"].split(",")[0],
                    gpu_indexes=gres_indexes(j.get("gres_detail") or []), start_time=_number(j.get("start_time")),
                    end_time=_number(j.get("end_time")), reason=j.get("state_reason") or "",
                    account=j.get("account") or "",
                )  # fmt: skip
                out[job.job_id] = job
            return out
        text = self._run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k|%N|%r|%a"])
        out = {}
        for line in text.splitlines():
            jid, state, comment, node, reason, account = (line.split("|") + [""] * 6)[:6]
            out[jid] = SlurmJob(job_id=jid, state=state, comment=comment, node=node, reason=reason, account=account)
        return out

    def gpu_indexes(self, job_id: str) -> list[int]:
        """GPU indexes of a running job from `scontrol show job -d` (the text path has no GRES detail)."""
        return gres_indexes([self._run(["scontrol", "show", "job", "-d", job_id])])

    def accounting(self, job_ids: Sequence[str] = (), *, start: str = "", end: str = "") -> dict[str, SlurmJob]:
        """Jobs from slurmdbd (what sacct says), by id: final states, exit codes, AllocTRES, elapsed."""
        sel = ["-j", ",".join(job_ids)] if job_ids else ["-a", "-S", start or "now-1days", "-E", end or "now"]
        if self.json and self.version >= ACCOUNTING_JSON_SINCE:
            data = json.loads(self._run(["sacct", *sel, "--json"]))
            out = {}
            for j in data.get("jobs", []):
                exit_code = j.get("exit_code") or {}
                alloc = {
                    (f"{t['type']}/{t['name']}" if t.get("name") else t["type"]): float(t.get("count") or 0)
                    for t in (j.get("tres") or {}).get("allocated", [])
                }
                time = j.get("time") or {}
                sig = (exit_code.get("signal") or {}).get("signal_id") if isinstance(exit_code, dict) else None
                job = SlurmJob(
                    job_id=str(j["job_id"]), state=_state_of(j.get("state")),
                    comment=((j.get("comment") or {}).get("job") or "") if isinstance(j.get("comment"), dict) else "",
                    node=j.get("nodes") or "", start_time=_number(time.get("start")), end_time=_number(time.get("end")),
                    exit_code=_number(exit_code.get("return_code")) if isinstance(exit_code, dict) else None,
                    signal=_number(sig), alloc_tres=alloc, account=j.get("account") or "",
                    elapsed_s=_number(time.get("elapsed")),
                )  # fmt: skip
                out[job.job_id] = job
            return out
        fmt = "JobIDRaw,State,ExitCode,Start,End,NodeList,AllocTRES,Account,ElapsedRaw,Comment"
        text = self._run(["sacct", *sel, "-X", "-n", "-P", "-o", fmt], env={"SLURM_TIME_FORMAT": "%s"})
        out = {}
        for line in text.splitlines():
            jid, state, code, start, end, node, tres, account, elapsed, comment = (line.split("|") + [""] * 10)[:10]
            rc, _, sig = code.partition(":")
            out[jid] = SlurmJob(
                job_id=jid, state=state.split()[0] if state else "", node=node, comment=comment,
                start_time=int(start) if start.isdigit() else None, end_time=int(end) if end.isdigit() else None,
                exit_code=int(rc) if rc.isdigit() else None, signal=int(sig) if sig.isdigit() and sig != "0" else None,
                alloc_tres=parse_tres(tres), account=account, elapsed_s=int(elapsed) if elapsed.isdigit() else None,
            )  # fmt: skip
        return out


def batch_script(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The generated batch script: the job's argv run as a plain process, every word shell-quoted (never a shell
    string from the user), its environment exported first."""
    lines = ["#!/bin/sh"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()) if re.fullmatch(r"[A-Za-z_]\w*", k)]
    lines.append("exec " + " ".join(shlex.quote(a) for a in command))
    return "\n".join(lines) + "\n"

"""The bridge's loop: poll the portal, submit its pool's jobs to Slurm, follow them, stream their output back.

State that must survive a restart lives in the portal (which jobs were claimed, each one's Slurm id, how many
output lines it has) and in Slurm (each job's comment names its portal job), so a restarted bridge neither loses
nor doubles a job: a claimed job without a Slurm id is first looked up by comment, and only submitted if absent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.slurm_bridge.client import PortalClient, PortalRefused, PortalUnavailable
from workers.slurm_bridge.slurm import (
    COMMENT_PREFIX,
    FINAL_STATES,
    RUNNING_STATES,
    Slurm,
    SlurmJob,
    SlurmNode,
    SlurmRefused,
    SlurmUnavailable,
    batch_script,
)

logger = logging.getLogger("workers.slurm_bridge")

RESERVATION_PREFIX = "portal-res-"
LOG_BATCH = 500  # lines per logs request
ACCOUNTING_GRACE_S = 120.0  # how long a job may be absent from both squeue and sacct before it is reported lost
# Slurm's final state -> (portal outcome, reason).
OUTCOMES = {
    "COMPLETED": ("succeeded", "exit_code"),
    "FAILED": ("failed", "exit_code"),
    "TIMEOUT": ("failed", "timeout"),
    "DEADLINE": ("failed", "timeout"),
    "OUT_OF_MEMORY": ("failed", "oom"),
    "CANCELLED": ("cancelled", "cancelled"),
    "PREEMPTED": ("cancelled", "preempted"),
    "NODE_FAIL": ("failed", "node_lost"),
    "BOOT_FAIL": ("failed", "node_lost"),
    "REVOKED": ("cancelled", "cancelled"),
}


@dataclass
class Followed:
    """What this process remembers about a job between polls (rebuilt from the portal after a restart)."""

    external_id: str
    reported: str = ""  # the last phase reported ("pending", "running")
    lines_sent: int = 0
    epoch: str = ""
    missing_since: float | None = None
    cancel_sent: bool = False
    gpu_indexes: list[int] = field(default_factory=list)


@dataclass
class Bridge:
    portal: PortalClient
    slurm: Slurm
    spool: Path
    inventory_every_s: float = 60.0
    models: dict[str, str] = field(default_factory=dict)  # GRES type -> portal GPU model name
    jobs: dict[int, Followed] = field(default_factory=dict)
    usage_every_s: float = 60.0
    refused_reservations: set[int] = field(default_factory=set)
    # A new end Slurm refused, by reservation (tried again only when the portal's end changes once more).
    refused_ends: dict[int, str] = field(default_factory=dict)
    _last_usage: float = float("-inf")
    _usage_since: float | None = None
    _last_inventory: float = float("-inf")
    _nodes: list[SlurmNode] = field(default_factory=list)

    def model_of(self, gres_type: str) -> str:
        return self.models.get(gres_type, gres_type)

    # -- one poll ----------------------------------------------------------------------------------------------

    def poll_once(self) -> dict[str, int]:
        counts = {"submitted": 0, "reported": 0}
        body: dict[str, Any] = {"version": self.slurm.version_text()}
        try:
            self._nodes = self.slurm.nodes()
        except SlurmUnavailable as exc:
            logger.warning("sinfo failed: %s", exc)
        if time.monotonic() - self._last_inventory >= self.inventory_every_s and self._nodes:
            body["nodes"] = [self._node_body(n) for n in self._nodes]
            self._last_inventory = time.monotonic()
        else:
            body["up"] = [n.name for n in self._nodes if n.up]
        work = self.portal.poll(body)
        self.models.update(work.get("options", {}).get("models", {}) or {})
        try:
            queue = self.slurm.queue()
        except SlurmUnavailable as exc:
            logger.warning("squeue failed (controller restarting?): %s", exc)
            return counts
        self._mirror_reservations(work.get("reservations", []))
        if time.monotonic() - self._last_usage >= self.usage_every_s:
            self._send_usage()
        for spec in work.get("submit", []):
            if self._submit(spec, queue):
                counts["submitted"] += 1
        follow = work.get("follow", [])
        live = {int(item["job_id"]) for item in follow}
        for job_id in list(self.jobs):
            if job_id not in live:
                del self.jobs[job_id]
        finished = [item["external_id"] for item in follow if queue.get(item["external_id"]) is None
                    or queue[item["external_id"]].state in FINAL_STATES]  # fmt: skip
        accounting: dict[str, SlurmJob] = {}
        if finished:
            try:
                accounting = self.slurm.accounting(finished)
            except SlurmUnavailable as exc:
                logger.warning("sacct failed: %s", exc)
        for item in follow:
            counts["reported"] += self._follow(item, queue, accounting)
        return counts

    def _node_body(self, node: SlurmNode) -> dict[str, Any]:
        gpus = []
        index = 0
        for kind, count in node.gpus:
            for _ in range(count):
                model = self.model_of(kind)
                gpus.append({"uuid": f"slurm:{node.name}:{index}", "index": index, "model": model, "name": kind})
                index += 1
        return {"name": node.name, "hostname": node.hostname, "up": node.up, "gpus": gpus}

    # -- usage -------------------------------------------------------------------------------------------------

    def _send_usage(self) -> None:
        """Ended jobs with GPUs from sacct since the last sync (an hour of overlap: the portal skips what it has;
        two days on the first sync) go to the portal, which bills those that ran outside it."""
        now = time.time()
        since = (self._usage_since - 3600) if self._usage_since is not None else now - 2 * 86400
        try:
            records = self.slurm.accounting(start=_slurm_time(since), end="now")
        except SlurmUnavailable as exc:
            logger.warning("sacct failed: %s", exc)
            return
        body = [
            {"external_id": int(j.job_id), "account": j.account, "node": j.node, "gpus": int(j.alloc_tres["gres/gpu"]),
             "start": j.start_time, "end": j.end_time}
            for j in records.values()
            if j.state in FINAL_STATES and j.alloc_tres.get("gres/gpu") and j.start_time and j.end_time
            and j.job_id.isdigit() and not j.comment.startswith(COMMENT_PREFIX)
        ]  # fmt: skip
        for i in range(0, len(body), 500):
            self.portal.post("usage/", {"records": body[i : i + 500]})
        self._usage_since = now
        self._last_usage = time.monotonic()

    # -- reservations ------------------------------------------------------------------------------------------

    def _mirror_reservations(self, wanted: list[dict[str, Any]]) -> None:
        """Make Slurm's `portal-res-*` reservations the portal's: create the missing, point those on other nodes at
        the portal's (it moved a booking off a GPU that is gone or was repartitioned), follow a changed end, delete
        the ended. A refused creation or move goes back to the portal with Slurm's words, and the portal gives the
        reservation up."""
        try:
            have = {k: v for k, v in self.slurm.reservations().items() if k.startswith(RESERVATION_PREFIX)}
        except SlurmUnavailable as exc:
            logger.warning("scontrol show reservation failed: %s", exc)
            return
        names = set()
        for item in wanted:
            name = f"{RESERVATION_PREFIX}{item['id']}"
            names.add(name)
            if int(item["id"]) in self.refused_reservations:
                continue
            nodes = sorted(str(n) for n in item["nodes"])
            try:
                if name not in have:
                    start = max(float(item["start"]), time.time() + 1)
                    self.slurm.create_reservation(name=name, start=_slurm_time(start),
                                                  end=_slurm_time(float(item["end"])), account=str(item["team"]),
                                                  nodes=nodes)  # fmt: skip
                    logger.info("reservation %s created for %s on %s", name, item["team"], ",".join(nodes))
                else:
                    held = have[name].get("Nodes", "")
                    if sorted(self.slurm.hostnames(held)) != nodes:
                        self.slurm.move_reservation(name=name, nodes=nodes)
                        logger.info("reservation %s moved from %s to %s", name, held, ",".join(nodes))
                    self._mirror_end(name, int(item["id"]), have[name].get("EndTime", ""), float(item["end"]))
            except SlurmRefused as exc:
                logger.info("Slurm refused reservation %s: %s", name, exc)
                self.refused_reservations.add(int(item["id"]))
                self.portal.post(f"reservations/{item['id']}/refused/", {"message": str(exc)})
            except SlurmUnavailable as exc:
                logger.warning("mirroring reservation %s failed: %s", name, exc)
        for name in set(have) - names:
            try:
                self.slurm.delete_reservation(name)
                logger.info("reservation %s deleted (ended in the portal)", name)
            except SlurmUnavailable as exc:
                logger.warning("deleting reservation %s failed: %s", name, exc)

    def _mirror_end(self, name: str, reservation_id: int, slurm_end: str, end: float) -> None:
        """Follow the portal's end (the booking was extended or shortened). A refusal (Slurm will not stretch a
        reservation over nodes that others hold later) keeps the booking and its old end in Slurm: the portal
        checked its own GPUs, so only work submitted to Slurm directly can stand in the way."""
        wanted = _slurm_time(end)
        if slurm_end == wanted or self.refused_ends.get(reservation_id) == wanted:
            return
        try:
            self.slurm.set_reservation_end(name=name, end=wanted)
        except SlurmRefused as exc:
            self.refused_ends[reservation_id] = wanted
            logger.warning("Slurm refused to move the end of reservation %s to %s: %s", name, wanted, exc)
            return
        self.refused_ends.pop(reservation_id, None)
        logger.info("reservation %s now ends at %s (was %s)", name, wanted, slurm_end)

    # -- submitting --------------------------------------------------------------------------------------------

    def _gres(self, spec: dict[str, Any]) -> str:
        types = {kind for n in self._nodes for kind, _ in n.gpus}
        wanted = [t for t in sorted(types) if self.model_of(t) in spec["gpu_models"]]
        count = int(spec["gpu_count"])
        if not wanted or len(wanted) == len(types):
            return f"gpu:{count}"
        # Slurm's --gres names one type; the first acceptable one it has.
        return f"gpu:{wanted[0]}:{count}"

    def _submit(self, spec: dict[str, Any], queue: dict[str, SlurmJob]) -> bool:
        job_id = int(spec["job_id"])
        comment = f"{COMMENT_PREFIX}{job_id}"
        existing = [j for j in queue.values() if j.comment == comment]
        if existing:  # submitted before a restart (or before a lost answer): adopt it, never submit twice
            self._tell_submitted(job_id, existing[0].job_id)
            return False
        self.spool.mkdir(parents=True, exist_ok=True)
        try:
            slurm_id = self.slurm.submit(
                script=batch_script(spec["command"], spec.get("env") or {}),
                account=spec["team"],
                gres=self._gres(spec),
                minutes=max(1, -(-int(spec["max_duration_s"]) // 60)),
                comment=comment,
                output=str(self.output_of(job_id)),
                name=(spec.get("name") or f"portal-{job_id}")[:100],
                cpus=max(1, int(float(spec.get("cpus") or 1) + 0.999)),
                memory_mib=int(spec.get("memory_mib") or 1024),
                reservation=str(spec.get("reservation") or ""),
            )
        except SlurmRefused as exc:
            logger.info("Slurm refused job %s: %s", job_id, exc)
            self.portal.submitted(job_id, {"refused": f"Slurm refused the job: {exc}"})
            return False
        except SlurmUnavailable as exc:
            logger.warning("sbatch failed for job %s: %s", job_id, exc)
            return False
        logger.info("job %s is Slurm job %s", job_id, slurm_id)
        self._tell_submitted(job_id, slurm_id)
        return True

    def _tell_submitted(self, job_id: int, slurm_id: str) -> None:
        try:
            self.portal.submitted(job_id, {"external_id": slurm_id})
        except PortalRefused as exc:
            logger.warning("portal refused the id of job %s: %s", job_id, exc)

    def output_of(self, job_id: int) -> Path:
        return self.spool / f"job-{job_id}.out"

    # -- following ---------------------------------------------------------------------------------------------

    def _follow(self, item: dict[str, Any], queue: dict[str, SlurmJob], accounting: dict[str, SlurmJob]) -> int:
        job_id, slurm_id = int(item["job_id"]), str(item["external_id"])
        state = self.jobs.get(job_id)
        if state is None or state.external_id != slurm_id:
            epoch = f"slurm-{slurm_id}"
            sent = int(item.get("log_agent_seq") or 0) if item.get("log_epoch") == epoch else 0
            state = self.jobs[job_id] = Followed(external_id=slurm_id, epoch=epoch, lines_sent=sent)
        queued = queue.get(slurm_id)
        final = accounting.get(slurm_id)
        if item.get("stop") and not state.cancel_sent and (queued is None or queued.state not in FINAL_STATES):
            try:
                self.slurm.cancel(slurm_id)
                state.cancel_sent = True
            except SlurmUnavailable as exc:
                logger.warning("scancel %s failed: %s", slurm_id, exc)
        if final is not None and final.state in FINAL_STATES:
            return self._ended(job_id, state, final, queued)
        if queued is None:
            state.missing_since = state.missing_since or time.monotonic()
            if time.monotonic() - state.missing_since > ACCOUNTING_GRACE_S:
                lost = SlurmJob(job_id=slurm_id, state="NODE_FAIL")
                return self._ended(job_id, state, lost, None, message="Slurm no longer knows this job")
            return 0
        state.missing_since = None
        if queued.state in RUNNING_STATES or queued.state in FINAL_STATES:
            sent = 0
            if state.reported != "running":
                indexes = queued.gpu_indexes or self._indexes(slurm_id)
                state.gpu_indexes = indexes
                self._report(job_id, {"phase": "running", "external_state": queued.state, "node": queued.node,
                                      "gpu_indexes": indexes, "started_at": queued.start_time})  # fmt: skip
                state.reported = "running"
                sent = 1
            self._stream(job_id, state, final=False)
            return sent
        if state.reported != "pending":
            self._report(job_id, {"phase": "pending", "external_state": queued.state, "message": queued.reason})
            state.reported = "pending"
            return 1
        return 0

    def _indexes(self, slurm_id: str) -> list[int]:
        try:
            return self.slurm.gpu_indexes(slurm_id)
        except SlurmUnavailable:
            return []

    def _ended(self, job_id: int, state: Followed, final: SlurmJob, queued: SlurmJob | None, message: str = "") -> int:
        node = final.node or (queued.node if queued else "")
        indexes = state.gpu_indexes or (queued.gpu_indexes if queued else [])
        if state.reported != "running" and final.start_time and node and final.state != "CANCELLED":
            # It ran between two polls: the portal places it first, so its output has a job on a node to go to.
            self._report(job_id, {"phase": "running", "external_state": final.state, "node": node,
                                  "gpu_indexes": indexes, "started_at": final.start_time})  # fmt: skip
            state.reported = "running"
        total = self._stream(job_id, state, final=True)
        outcome, reason = OUTCOMES.get(final.state, ("failed", "exit_code"))
        exit_code = final.exit_code
        if final.signal:
            exit_code = 128 + final.signal
        words = message or f"Slurm job {final.job_id}: {final.state}"
        if final.state == "COMPLETED":
            exit_code = exit_code or 0
        body = {
            "phase": "ended", "external_state": final.state, "outcome": outcome, "reason": reason,
            "exit_code": exit_code, "message": words, "log_total": total,
            "node": node, "gpu_indexes": indexes, "started_at": final.start_time,
            "ended_at": final.end_time,
        }  # fmt: skip
        self._report(job_id, body)
        self.jobs.pop(job_id, None)
        return 1

    def _report(self, job_id: int, body: dict[str, Any]) -> None:
        try:
            self.portal.report(job_id, body)
        except PortalRefused as exc:
            logger.warning("portal refused the report on job %s: %s", job_id, exc)

    def _stream(self, job_id: int, state: Followed, *, final: bool) -> int:
        """Send the output lines not sent yet (a last line without its newline only when the job has ended);
        returns how many lines the file has."""
        path = self.output_of(job_id)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return state.lines_sent
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        elif not final and lines:
            lines.pop()  # still being written
        new = lines[state.lines_sent :]
        while new:
            batch = new[:LOG_BATCH]
            body = {"epoch": state.epoch, "first": state.lines_sent + 1,
                    "lines": [{"stream": "stdout", "text": line} for line in batch]}  # fmt: skip
            self.portal.logs(job_id, body)
            state.lines_sent += len(batch)
            new = new[LOG_BATCH:]
        return len(lines)


def run_forever(bridge: Bridge, *, poll_s: float, stop_after: float | None = None) -> None:
    started = time.monotonic()
    while stop_after is None or time.monotonic() - started < stop_after:
        begin = time.monotonic()
        try:
            bridge.poll_once()
        except PortalUnavailable as exc:
            logger.warning("portal unavailable: %s", exc)
        except PortalRefused as exc:
            logger.error("portal refused the poll: %s", exc)
        time.sleep(max(0.0, poll_s - (time.monotonic() - begin)))


def _slurm_time(epoch: float) -> str:
    """Slurm reads times in the local time of its hosts, without a zone."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))

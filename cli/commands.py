"""The subcommands: each takes the client and the parsed command line and returns the exit code."""

from __future__ import annotations

import argparse
import json
import signal
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from cli.client import Client
from cli.exits import EXIT_USAGE, SIGNALS, TERMINAL, CliError, Interrupted, exit_code_of
from cli.follow import POLL_S, describe, follow, print_lines, say

CANCEL_TIMEOUT_S = 10.0  # a runner that sent SIGTERM sends SIGKILL after a grace period: cancel within it


def part_fields(args: argparse.Namespace) -> dict[str, Any]:
    """`mig_profile` or `gpu_share` for a job or booking on part of a GPU (the parser allows one at most)."""
    if args.mig_profile:
        return {"mig_profile": args.mig_profile}
    if args.share is not None:
        return {"gpu_share": args.share}
    if args.mig_memory is not None:
        return {"mig_memory_mib": args.mig_memory}
    return {}


def device_text(gpu: dict[str, Any] | str) -> str:
    """One allocated device: a whole GPU's uuid, a MIG instance with its profile and GPU, or a share of a GPU."""
    if not isinstance(gpu, dict):
        return str(gpu)
    name = str(gpu.get("uuid", "?"))
    if gpu.get("profile"):
        parent = f" of {gpu['parent']}" if gpu.get("parent") else ""
        return f"{name} ({gpu['profile']}{parent})"
    share = gpu.get("share")
    if share is not None and float(share) < 1:
        return f"{float(share):g} of {name}"
    return name


def holder_text(holder: dict[str, Any] | None) -> str:
    """Who holds a GPU or part: "job vision 42", "reservation vision 7" (the id only for one's own team's)."""
    holder = holder or {}
    return " ".join(str(holder[k]) for k in ("kind", "team", "id") if holder.get(k) is not None)


def share_lines(gpu: dict[str, Any]) -> list[str]:
    """One line per holder of a GPU's shares (the API's `share_holders`): which shares, what its job's own processes
    use of their memory (the GPU's reading is every share's), who. A job on half of a GPU split in four: one line."""
    total = gpu.get("shares") or len(gpu.get("share_devices") or [])
    lines = []
    for row in gpu.get("share_holders") or []:
        indexes = sorted(int(i) + 1 for i in row.get("indexes") or [])
        if not indexes:
            continue
        if len(indexes) == 1:
            name = f"share {indexes[0]}/{total}"
        elif len(indexes) == total:  # a whole-GPU job or booking of a shared GPU
            name = f"all {total} shares"
        elif indexes == list(range(indexes[0], indexes[-1] + 1)):
            name = f"shares {indexes[0]}-{indexes[-1]}/{total}"
        else:
            name = f"shares {','.join(map(str, indexes))}/{total}"
        used, mem = row.get("memory_used_mib"), int(row.get("memory_mib") or 0)
        busy = row.get("sm_active_pct")
        figures = (f"{used}/{mem} MiB  " if used is not None else "") + (f"SM {busy}%  " if busy is not None else "")
        lines.append(f"{name:<11} {figures}{holder_text(row.get('holder'))}")
    return lines


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    if not args.argv:
        raise CliError("give the command after --, e.g. gpuportal submit --image IMG -- python train.py", EXIT_USAGE)
    env: dict[str, str] = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--env {item!r}: expected NAME=value", EXIT_USAGE)
        env[name] = value
    body: dict[str, Any] = {"image": args.image, "command": list(args.argv), "gpu_count": args.gpus, "env": env}
    for key, value in (
        ("team", args.team),
        ("name", args.name),
        ("max_duration_s", args.max_duration),
        ("cpus", args.cpus),
        ("memory_mib", args.memory),
        ("priority", args.priority),
        ("reservation", args.reservation),
        ("pool", args.pool),
    ):
        if value is not None:
            body[key] = value
    body.update(part_fields(args))
    if args.model:
        models = [m for m in args.model.split(",") if m]
        body["gpu_model"] = models[0] if len(models) == 1 else models
    # One key for every retry of this submission: a lost answer never queues the job twice.
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    # A signal during the submission waits for its answer: then the job's id is known and it can be cancelled.
    SIGNALS.hold()
    try:
        job = client.request("POST", "/jobs/", json=body, headers={"Idempotency-Key": key})
    finally:
        pending = SIGNALS.release()
    if pending is not None:
        return cancel_on_signal(client, job, pending)
    if not args.wait:
        print(json.dumps(job, indent=2) if args.json else job["id"])
        return 0
    say(f"job {job['id']} submitted: {client.base}/jobs/{job['id']}/")
    try:
        final = follow(client, int(job["id"]), show_logs=not args.no_logs)
    except Interrupted as exc:
        return cancel_on_signal(client, job, exc.signame)
    if args.json:
        print(json.dumps(final, indent=2))
    return exit_code_of(final)


def cancel_on_signal(client: Client, job: dict[str, Any], signame: str) -> int:
    """Ctrl-C, SIGTERM or SIGHUP while a job is ours: cancel it (CI runners send these when a pipeline is
    cancelled or times out; the job would otherwise keep its GPUs), say so, and exit 130."""
    SIGNALS.install(signal.SIG_IGN)
    say(f"{signame} received: cancelling job {job['id']}")
    budget = min(client.timeout, CANCEL_TIMEOUT_S)
    deadline = time.monotonic() + budget
    now = client.request("POST", f"/jobs/{job['id']}/cancel/", timeout=budget)
    # A job on a node ends when the node has stopped it: wait for that within the budget, to say how it ended.
    try:
        while isinstance(now, dict) and now.get("state") not in TERMINAL and time.monotonic() < deadline:
            time.sleep(POLL_S)
            now = client.request("GET", f"/jobs/{job['id']}/", timeout=max(0.5, deadline - time.monotonic()))
    except CliError:
        pass  # the cancel was accepted; only the confirmation is missing
    if isinstance(now, dict) and now.get("state") in TERMINAL:
        say(describe(now))
    else:
        say(f"job {job['id']}: cancel accepted, the node is stopping it")
    return 130


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.request("GET", f"/jobs/{args.job_id}/")
    if args.json:
        print(json.dumps(job, indent=2))
    else:
        print(describe(job))
        print(f"  image {job['image']}  command {json.dumps(job['command'])}")
        if job.get("mig_profile"):
            gpus = f"a {job['mig_profile']} MIG instance"
        elif job.get("gpu_share") is not None:
            gpus = f"{float(job['gpu_share']):g} of a GPU"
        else:
            gpus = f"{job['gpu_count']} GPU(s)"
        print(f"  {gpus}  submitted {job['submitted_at']}  cost {job['cost']} {job['currency']}")
        if job.get("gpus"):
            print(f"  on {', '.join(device_text(g) for g in job['gpus'])}")
        if job.get("gpu_memory_peak_mib") is not None:
            util = job.get("gpu_utilization_mean")
            mean = f", mean utilization {util}%" if util is not None else ""
            print(f"  GPU memory peak {job['gpu_memory_peak_mib']} MiB{mean}")
        for item in job.get("advice") or []:
            print(f"  advice {item['code']}: {item['detail']}")
    return 0


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.follow:
        final = follow(client, args.job_id, quiet=True)
        return exit_code_of(final)
    after = 0
    while True:
        body = client.request("GET", f"/jobs/{args.job_id}/logs/", params={"after": after, "limit": 5000})
        print_lines(body["lines"])
        after = body["last_seq"]
        if not body.get("more"):
            return 0


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.request("POST", f"/jobs/{args.job_id}/cancel/")
    print(describe(job))
    return 0


def cmd_gpus(client: Client, args: argparse.Namespace) -> int:
    body = client.request("GET", "/gpus/", params={"limit": 1000})
    rows = body.get("results", body) if isinstance(body, dict) else body
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NODE':<16} {'#':>2} {'MODEL':<14} {'STATUS':<9} {'UTIL':>5} {'MEMORY':>15}  HOLDER")
    for g in rows:
        util = "-" if g.get("utilization") is None else f"{g['utilization']}%"
        used, total = g.get("memory_used_mib"), g.get("memory_total_mib") or g.get("memory_mib")
        mem = "-" if used is None else f"{used}/{total} MiB"
        who = holder_text(g.get("holder"))
        instances = g.get("mig_devices") or []
        if instances:
            free = sum(1 for m in instances if not m.get("holder"))
            who = f"MIG: {free}/{len(instances)} instances free"
        elif (g.get("shares") or 1) > 1:
            who = " ".join(filter(None, [f"shared: {g.get('shares_free', 0)}/{g['shares']} shares free", who]))
        print(f"{g['node']:<16} {g['index']:>2} {g['model']:<14} {g['status']:<9} {util:>5} {mem:>15}  {who}")
        # Each instance under its GPU: the uuid a job on it sees, the memory it uses, and who holds it.
        for m in instances:
            used_mib, busy = m.get("memory_used_mib"), m.get("sm_active_pct")
            m_mem = "" if used_mib is None else f"{used_mib}/{m.get('memory_mib', '?')} MiB  "
            m_mem += "" if busy is None else f"SM {busy}%  "
            line = f"{'':<19} └ {m.get('profile', '?'):<11} {m.get('uuid', '')}  {m_mem}{holder_text(m.get('holder'))}"
            print(line.rstrip())
        for line in share_lines(g):
            print(f"{'':<19} └ {line}".rstrip())
    return 0


def cmd_reserve(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"start": args.start, "end": args.end, "note": args.note or ""}
    if args.gpus is not None:
        body["gpu_count"] = args.gpus
    body.update(part_fields(args))
    if args.team:
        body["team"] = args.team
    else:
        me = client.request("GET", "/me")
        teams = [t["team"]["slug"] if isinstance(t["team"], dict) else t["team"] for t in me.get("teams", [])]
        if len(teams) != 1:
            raise CliError(
                f"say which team with --team (you are in: {', '.join(map(str, teams)) or 'none'})", EXIT_USAGE
            )
        body["team"] = teams[0]
    if args.model:
        body["gpu_model"] = args.model
    key = f"cli-{uuid.uuid4()}"
    resv = client.request("POST", "/reservations/", json=body, headers={"Idempotency-Key": key})
    if args.json:
        print(json.dumps(resv, indent=2))
        return 0
    if args.mig_profile:
        what = f"{resv.get('gpu_count')} {args.mig_profile} instance(s)"
    elif args.share is not None:
        what = f"{args.share:g} of a GPU"
    elif args.mig_memory is not None:
        what = f"{resv.get('gpu_count')} MIG instance(s) of at least {args.mig_memory} MiB"
    else:
        what = f"{resv.get('gpu_count')} GPU(s)"
    gpus = ", ".join(device_text(g) for g in resv.get("gpus", []))
    print(f"reservation {resv['id']}: {what} {resv['start']} → {resv['end']} [{gpus}]")
    return 0


def reservation_line(resv: dict[str, Any]) -> str:
    """ "#7 vision active 2026-03-01T09:00:00+01:00 → …T17:00:00+01:00 [GPU-…]": one reservation of the list."""
    gpus = ", ".join(device_text(g) for g in resv.get("gpus", []))
    return f"#{resv['id']} {resv.get('team', '?')} {resv.get('status', '?')} {resv['start']} → {resv['end']} [{gpus}]"


def cmd_reservations(client: Client, args: argparse.Namespace) -> int:
    """Your teams' reservations that are booked or holding GPUs now (with --all: ended ones too), soonest first."""
    params: dict[str, Any] = {"limit": 200}
    if not args.all:
        params["status"] = "booked,active"
    if args.team:
        params["team"] = args.team
    body = client.request("GET", "/reservations/", params=params)
    rows = body.get("results", body) if isinstance(body, dict) else body
    rows = sorted(rows, key=lambda r: (str(r.get("start")), int(r.get("id", 0))))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for resv in rows:
        print(reservation_line(resv))
    if not rows:
        say("no reservations" if args.all else "no reservations booked or active")
    return 0


def cmd_release(client: Client, args: argparse.Namespace) -> int:
    """Cancel a booking before its start, or release its GPUs now after it (billing stops at once)."""
    resv = client.request("DELETE", f"/reservations/{args.reservation_id}/")
    if args.json:
        print(json.dumps(resv, indent=2))
        return 0
    print(reservation_line(resv))
    return 0


def cmd_extend(client: Client, args: argparse.Namespace) -> int:
    """Move a reservation's end: `--by` later than it is now, or to `--end`. Refused (exit 201) when the GPUs are
    not free for the added time or the quota does not allow it, as the portal says."""
    if args.by is not None:
        resv = client.request("GET", f"/reservations/{args.reservation_id}/")
        end = (datetime.fromisoformat(str(resv["end"]).replace("Z", "+00:00")) + timedelta(seconds=args.by)).isoformat()
    else:
        end = args.end
    resv = client.request("PATCH", f"/reservations/{args.reservation_id}/", json={"end": end})
    if args.json:
        print(json.dumps(resv, indent=2))
        return 0
    print(reservation_line(resv))
    return 0

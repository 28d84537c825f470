"""GPU sharing on a machine with real NVIDIA GPUs: MIG state and profiles, and jobs on quarters of one GPU.

    .venv/bin/python -m bench.device_sharing [--seconds 8] [--mps] [--json-out FILE]

Read only towards the GPU's configuration: MIG mode and compute mode are read, never changed, and the GPU is never
reset. With GPUs NVML reports:

1. MIG, per GPU: the current and pending MIG mode (`nvmlDeviceGetMigMode`), and the GPU instance profiles the
   board offers (`nvmlDeviceGetGpuInstanceProfileInfo` for each NVML profile id: slices, memory, how many fit),
   named as the portal names them (workers/gpu/mig.py) and compared with the portal's table for the model. In MIG
   mode, the instances the agent discovers (`NvmlBackend`), with their memory and, on Hopper and later, their SM
   activity from GPM.
2. Two jobs on quarters of the first GPU not in MIG mode, launched by the agent's process runtime exactly as for
   the portal (`LaunchSpec` with `gpu_share` 0.25 and the quarter's memory as `gpu_memory_mib`), side by side:
   - "compute": told its budget, it applies it the way the job environment asks of a PyTorch job on a
     time-sliced share (`torch.cuda.set_per_process_memory_fraction` from `GPUPORTAL_GPU_MEMORY_MIB`), tries to
     allocate twice its budget 256 MiB at a time (the allocator refuses at the budget), then runs bf16 matrix
     products;
   - "holds": allocates 1 GiB and sleeps.
   Meanwhile NVML is sampled twice a second with processes and per-process utilization every tick, and the
   agent's attribution (workers/jobmem.py, by session id) turns them into each job's memory and SM activity.
   Checks: each job sees exactly the GPU, is told the quarter's budget and `GPUPORTAL_GPU_ISOLATION` "none"; the
   compute job's allocations are refused at or below its budget, and NVML never shows its process holding more
   than the budget plus its CUDA context; its SM activity is above 50% while the holder's stays at or below 5%.
   Shown: how often the listing explained the GPU's memory used (the agent's LISTING_SLACK_MIB), and what no
   job's processes held.
3. With `--mps` and `nvidia-cuda-mps-control` on the PATH: the same compute job under a private MPS control
   daemon (its own pipe and log directories, stopped afterwards; compute mode untouched), the limits set through
   the agent's own code (`workers.gpu.mps.ShareLimits`), and the job not applying any limit itself: the driver's
   pinned-memory limit must refuse its allocations near the budget.

Output: readable text, then one JSON document (also written to --json-out, or to $OUT/device_sharing.json when $OUT
is set). Exit status: 0 every check that ran passed, 1 one failed, 2 NVML is not usable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA ordinals = NVML indices, as the MPS daemon needs

from bench.device_jobs import Collected, GpuWatch
from workers.gpu.mig import profiles_for
from workers.gpu.mps import MpsControl, ShareLimits
from workers.gpu.nvml import NvmlUnavailable
from workers.jobmem import LISTING_SLACK_MIB, JobMemory, RunningJob
from workers.runtimes.base import LaunchSpec
from workers.runtimes.process import ProcessRuntime

CONTEXT_ALLOWANCE_MIB = 1024  # a CUDA context and PyTorch's kernels, which no allocator limit covers

# mode "fraction": apply the budget as the job environment asks; "none": leave it to MPS. Then allocate up to twice
# the budget, 256 MiB at a time, keep what was granted, and run products for `seconds`.
COMPUTE_PROGRAM = r"""
import os, sys, time
import torch
seconds, mode = float(sys.argv[1]), sys.argv[2]
env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "GPUPORTAL_GPU_SHARE", "GPUPORTAL_GPU_ISOLATION",
       "GPUPORTAL_GPU_MEMORY_MIB", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
       "PYTORCH_CUDA_ALLOC_CONF")}
print("env", env, flush=True)
props = torch.cuda.get_device_properties(0)
budget = int(env["GPUPORTAL_GPU_MEMORY_MIB"] or 0)
print("device", props.name, "uuid", str(props.uuid), "pid", os.getpid(), "count", torch.cuda.device_count(),
      "total_mib", props.total_memory >> 20, "budget_mib", budget, flush=True)
if mode == "fraction" and budget:
    torch.cuda.set_per_process_memory_fraction(min(1.0, (budget << 20) / props.total_memory))
chunks = []
try:
    while len(chunks) * 256 < 2 * budget:
        chunks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    print("granted", len(chunks) * 256, "MiB: nothing refused", flush=True)
except torch.OutOfMemoryError as exc:
    print("granted", len(chunks) * 256, "MiB, then refused:", str(exc).splitlines()[0][:200], flush=True)
while chunks and len(chunks) * 256 > budget - 512:
    chunks.pop()  # room for the products below
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
    n += 20
print("done", n, "products", flush=True)
"""

HOLD_PROGRAM = r"""
import os, sys, time
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("pid", os.getpid(), "holds 1024 MiB", flush=True)
time.sleep(float(sys.argv[1]))
"""


def check_mig() -> list[dict[str, Any]]:
    """MIG mode and the GPU instance profiles of each GPU (read only)."""
    import pynvml as nv

    out: list[dict[str, Any]] = []
    nv.nvmlInit()
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            name = nv.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            entry: dict[str, Any] = {"index": index, "name": name}
            try:
                current, pending = nv.nvmlDeviceGetMigMode(handle)
                entry["mig_mode"] = {"current": int(current), "pending": int(pending)}
            except nv.NVMLError as exc:
                entry["mig_mode"] = f"not readable: {exc}"
            profiles = []
            ids = sorted(a for a in dir(nv) if a.startswith("NVML_GPU_INSTANCE_PROFILE_") and "_SLICE" in a)
            for attr in ids:
                try:
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, getattr(nv, attr))
                except nv.NVMLError:
                    continue  # not offered by this board (or MIG not supported at all)
                label = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
                profiles.append(
                    {
                        "nvml": attr.removeprefix("NVML_GPU_INSTANCE_PROFILE_"),
                        "name": label.removeprefix("MIG ").strip(),
                        "slices": int(info.sliceCount),
                        "memory_mib": int(info.memorySizeMB),
                        "instances": int(info.instanceCount),
                    }
                )
            entry["profiles"] = profiles
            out.append(entry)
    finally:
        nv.nvmlShutdown()
    return out


def name_profiles(entry: dict[str, Any], model: str | None) -> None:
    """Compare the profiles NVML offers with the portal's table for the model (workers/gpu/mig.py): each NVML
    profile the table has (same name, memory within 1 GiB, same count), and the table's profiles NVML lacks. NVML
    also lists variants the portal does not book (`+me`, `+gfx`), which are left aside."""
    table = profiles_for(model) if model else {}
    for p in entry["profiles"]:
        known = table.get(p["name"])
        p["in_portal_table"] = bool(
            known and abs(known.memory_mib - p["memory_mib"]) <= 1024 and known.max_count == p["instances"]
        )
    offered = {p["name"] for p in entry["profiles"] if p["in_portal_table"]}
    entry["portal_model"] = model
    entry["portal_profiles_missing"] = sorted(set(table) - offered)
    entry["portal_table_matches"] = bool(table) and not entry["portal_profiles_missing"]


def _run_pair(watch: GpuWatch, uuid: str, total_mib: int, seconds: float, *, mps_pipe: str | None) -> dict[str, Any]:
    budget = total_mib // 4
    collected = Collected()
    state_dir = tempfile.mkdtemp(prefix="portal-device-sharing-")
    runtime = ProcessRuntime(state_dir=state_dir, events=collected.events(), timeout_grace_s=3.0)
    env = {"CUDA_MPS_PIPE_DIRECTORY": mps_pipe} if mps_pipe else {}
    mode = "none" if mps_pipe else "fraction"
    specs = {
        11: LaunchSpec(job_id=11, image="-", command=[sys.executable, "-c", COMPUTE_PROGRAM, str(seconds), mode],
                       env=env, gpu_uuids=[uuid], gpu_share=0.25, gpu_memory_mib=budget, mps=bool(mps_pipe)),
        12: LaunchSpec(job_id=12, image="-", command=[sys.executable, "-c", HOLD_PROGRAM, str(seconds + 4)],
                       env=env, gpu_uuids=[uuid], gpu_share=0.25, gpu_memory_mib=budget, mps=bool(mps_pipe)),
    }  # fmt: skip
    # The agent's attribution, live: a job's processes are found by their session (the leader's pid).
    watch.annotate = JobMemory(lambda: [RunningJob(j, (uuid,), h) for j, h in list(collected.started.items())]).annotate
    try:
        watch.start()
        for job_id, spec in specs.items():
            collected.expect(job_id)
            runtime.launch(spec)
        finished = all(collected.done[j].wait(seconds + 120) for j in specs)
        watch.stop()
    finally:
        watch.annotate = None
        runtime.close()
        shutil.rmtree(state_dir, ignore_errors=True)
    logs = {j: collected.logs.get(j, []) for j in specs}
    per_job: dict[int, dict[str, list[int]]] = {j: {"mem": [], "busy": []} for j in specs}
    for seen in watch.samples:
        if seen.uuid != uuid:
            continue
        for j in specs:
            if seen.job_memory and j in seen.job_memory:
                per_job[j]["mem"].append(seen.job_memory[j])
            if seen.job_util and j in seen.job_util:
                per_job[j]["busy"].append(seen.job_util[j])
    granted = next((int(line.split()[2]) for line in logs[11] if line.split()[1:2] == ["granted"]), None)
    exit_codes = {j: (o.exit_code if (o := collected.outcomes.get(j)) else None) for j in specs}
    compute_mem = max(per_job[11]["mem"], default=None)
    compute_busy = max(per_job[11]["busy"], default=None)
    holder_busy = max(per_job[12]["busy"], default=None)
    refused = any("refused" in line for line in logs[11])
    isolation = "mps" if mps_pipe else "none"
    ok = bool(
        finished
        and all(code == 0 for code in exit_codes.values())
        and any(f"'GPUPORTAL_GPU_MEMORY_MIB': '{budget}'" in line for line in logs[11])
        and any(f"'GPUPORTAL_GPU_ISOLATION': '{isolation}'" in line for line in logs[11])
        and any("count 1" in line for line in logs[11])
        and refused
        and granted is not None
        and granted <= budget
        and compute_mem is not None
        and compute_mem <= budget + CONTEXT_ALLOWANCE_MIB
        # Under MPS the driver may count the clients' work to the MPS server's process: shown, not checked.
        and (mps_pipe is not None or ((compute_busy or 0) > 50 and holder_busy is not None and holder_busy <= 5))
    )
    result: dict[str, Any] = {
        "ok": ok,
        "budget_mib": budget,
        "finished": finished,
        "exit_codes": exit_codes,
        "logs": logs,
        "compute_granted_mib": granted,
        "compute_refused": refused,
        "compute_mem_max_mib": compute_mem,
        "compute_busy_max_pct": compute_busy,
        "holder_mem_max_mib": max(per_job[12]["mem"], default=None),
        "holder_busy_max_pct": holder_busy,
        "process_util_read": any(s.process_util is not None for s in watch.samples if s.uuid == uuid),
        # Whether the process listing explains the GPU's memory used on this board (workers/jobmem.py: within
        # LISTING_SLACK_MIB), which a job with no process reading 0 MiB and a reservation's own work rely on:
        # shown, not checked (another tenant's process on a lent machine is not this run's).
        **_listing(watch, uuid),
    }
    return result


def _listing(watch: GpuWatch, uuid: str) -> dict[str, Any]:
    listed = [s for s in watch.samples if s.uuid == uuid and s.processes is not None and s.memory_used_mib is not None]
    unexplained = [(s.memory_used_mib or 0) - sum(mib for _, mib in s.processes or ()) for s in listed]
    others = [s.others for s in listed if s.others is not None]
    return {
        "listing_samples": len(listed),
        "listing_complete_share": round(len(others) / len(listed), 3) if listed else None,
        "unexplained_mib": [min(unexplained), max(unexplained)] if unexplained else None,
        "slack_mib": LISTING_SLACK_MIB,
        "others_mem_max_mib": max((o[0] for o in others), default=None),
    }


def check_shares(seconds: float, mps: bool) -> dict[str, Any]:
    watch = GpuWatch(keep_samples=True)
    try:
        target = next((i for i in watch.infos if not i.mig_mode), None)
        if target is None:
            print("\nshares: every GPU is in MIG mode; a share is of a GPU outside it: not run")
            return {"ran": False, "why": "every GPU is in MIG mode"}
        print(f"\nshares: two jobs on quarters of GPU {target.index} ({target.uuid}, {target.memory_mib} MiB)")
        out: dict[str, Any] = {"gpu": target.uuid, "time_sliced": _run_pair(watch, target.uuid, target.memory_mib,
                                                                                seconds, mps_pipe=None)}  # fmt: skip
        _print_pair("time-sliced", out["time_sliced"])
        if mps:
            out["mps"] = _with_mps(watch, target.index, target.uuid, target.memory_mib, seconds)
            if out["mps"].get("ran", True):
                _print_pair("MPS", out["mps"])
        return out
    finally:
        watch.close()


def _with_mps(watch: GpuWatch, index: int, uuid: str, total_mib: int, seconds: float) -> dict[str, Any]:
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        print("    MPS: nvidia-cuda-mps-control is not on the PATH: not run")
        return {"ran": False, "why": "no nvidia-cuda-mps-control"}
    base = Path(tempfile.mkdtemp(prefix="portal-mps-"))
    pipe, log = base / "pipe", base / "log"
    pipe.mkdir()
    log.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    started = subprocess.run([binary, "-d"], env=env, capture_output=True, text=True, timeout=30, check=False)
    if started.returncode != 0:
        return {"ran": False, "why": f"the daemon did not start: {started.stderr.strip() or started.returncode}"}
    try:
        limits = ShareLimits(MpsControl(binary, pipe_dir=str(pipe)), {uuid: index}, {uuid: total_mib})
        for job_id in (11, 12):
            limits.before_launch(job_id, [uuid], 0.25, total_mib // 4)
        return _run_pair(watch, uuid, total_mib, seconds, mps_pipe=str(pipe))
    finally:
        subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True, timeout=30, check=False)
        time.sleep(1.0)
        shutil.rmtree(base, ignore_errors=True)


def _print_pair(name: str, r: dict[str, Any]) -> None:
    print(f"  [{name}] ok={r['ok']} budget {r['budget_mib']} MiB, exit codes {r['exit_codes']}")
    for job_id, lines in r["logs"].items():
        for line in lines[:4]:
            print(f"    job {job_id}: {line[:240]}")
    print(
        f"    NVML, attributed per job: compute job up to {r['compute_mem_max_mib']} MiB and "
        f"{r['compute_busy_max_pct']}% of SMs; holder up to {r['holder_mem_max_mib']} MiB and "
        f"{r['holder_busy_max_pct']}% (per-process utilization read: {r['process_util_read']})"
    )
    print(
        f"    listing: {r['listing_samples']} reads, complete in {r['listing_complete_share']} of them; memory used "
        f"minus the processes' {r['unexplained_mib']} MiB (slack {r['slack_mib']}); no job's processes up to "
        f"{r['others_mem_max_mib']} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--mps", action="store_true", help="also run the compute job under a private MPS daemon")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {"host": os.uname().nodename, "started": time.time()}
    try:
        watch = GpuWatch()
    except NvmlUnavailable as exc:
        print(f"device sharing: NVML is not usable here: {exc}", file=sys.stderr)
        return 2
    models = {i.index: i.model for i in watch.infos}
    print("MIG, per GPU (read only):")
    for info in watch.infos:
        for device in info.mig_devices:
            print(f"  GPU {info.index}: instance {device.uuid} {device.profile}, {device.memory_mib} MiB")
    watch.close()
    report["mig"] = check_mig()
    for entry in report["mig"]:
        name_profiles(entry, models.get(entry["index"]))
        mode, model = entry["mig_mode"], entry["portal_model"]
        print(f"  GPU {entry['index']} {entry['name']}: MIG mode {mode}, portal model {model}")
        for p in entry["profiles"]:
            print(f"    {p['name']:>12} ({p['nvml']}): {p['slices']} slice(s), {p['memory_mib']} MiB, "
                  f"up to {p['instances']}; in the portal's table: {p['in_portal_table']}")  # fmt: skip
        print(f"    the portal's table agrees: {entry['portal_table_matches']} "
              f"(missing: {entry['portal_profiles_missing']})")  # fmt: skip
    report["shares"] = check_shares(args.seconds, args.mps)
    out = args.json_out or (Path(os.environ["OUT"]) / "device_sharing.json" if os.environ.get("OUT") else None)
    text = json.dumps(report, indent=2, default=str)
    if out is not None:
        out.write_text(text)
        print(f"\nJSON written to {out}")
    ran = [r for r in (report["shares"].get("time_sliced"), report["shares"].get("mps")) if r and r.get("ran", True)]
    return 0 if all(r["ok"] for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())

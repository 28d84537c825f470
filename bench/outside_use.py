"""What reading which GPUs are in use outside the portal costs a scheduler pass that has jobs to place and finds the
10-second cache expired: one HMGET of every schedulable GPU's latest sample and their decoding
(apps.telemetry.selectors.in_use_outside), against real Redis, for fleets of several sizes. Samples shaped as the
ingest writes them; a third show memory in use. Prints the median of `--repeat` reads per size.

Then what saying whose processes they are costs the fleet publisher once a second (and a GPU API page, and a
/metrics scrape) while that third is in use: `apps.telemetry.outside.outside_use` over them, each with a node's
process listing naming one owner uid of 50 (the allocations query against the real database, the owners' Redis
hash read whole, the uid -> user lookup from its 10-second cache as on every tick but the first).

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m bench.outside_use [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

import django

django.setup()

from apps.core.redis import get_redis  # noqa: E402
from apps.telemetry import keys  # noqa: E402
from apps.telemetry.outside import outside_use  # noqa: E402
from apps.telemetry.selectors import in_use_outside  # noqa: E402

SIZES = (64, 1_000, 6_212)  # a lab, an institute, the Alibaba trace's production fleet


def sample(uuid: str, k: int, now: float) -> dict[str, object]:
    used = 20_480 if k % 3 == 0 else 300
    return {
        "uuid": uuid, "node": f"node{k // 8:04d}", "index": k % 8, "model": "H100-80GB", "util": 0,
        "mem_used": used, "mem_total": 81_559, "temp": 35, "power": 70.5, "sm_clock": 345, "tensor": 0.0,
        "ts": now, "ecc_dbe": 0, "xid": None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    r = get_redis()
    for size in SIZES:
        now = time.time()
        uuids = [f"GPU-bench-{k:05d}" for k in range(size)]
        r.delete(keys.LATEST)
        r.hset(keys.LATEST, mapping={u: json.dumps(sample(u, k, now)) for k, u in enumerate(uuids)})
        times = []
        found = 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            found = len(in_use_outside(uuids))
            times.append(time.perf_counter() - t0)
        print(
            f"{size:>6} GPUs: {statistics.median(times) * 1000:7.2f} ms per read "
            f"(min {min(times) * 1000:.2f}), {found} in use outside the portal"
        )
        used = {u: (k, 20_480) for k, u in enumerate(uuids) if k % 3 == 0}
        r.delete(keys.JOB_MEMORY, keys.OWNER_MEMORY)
        r.hset(keys.JOB_MEMORY, mapping={f"{keys.OTHERS_JOB_ID}|{u}": f"{now},20480,20480" for u in used})
        r.hset(keys.OWNER_MEMORY, mapping={f"{1000 + k % 50}|{u}": f"{now},20480" for u, (k, _) in used.items()})
        times = []
        named = 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            named = sum(len(o["by"]) for o in outside_use(used, now=time.time()).values())
            times.append(time.perf_counter() - t0)
        print(
            f"{size:>6} GPUs, {len(used)} in use outside the portal: {statistics.median(times) * 1000:7.2f} ms to "
            f"say whose (min {min(times) * 1000:.2f}), {named} owners read"
        )
    r.delete(keys.LATEST, keys.JOB_MEMORY, keys.OWNER_MEMORY)


if __name__ == "__main__":
    main()

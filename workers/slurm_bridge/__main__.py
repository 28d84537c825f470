"""`python -m workers.slurm_bridge --pool NAME`: the Slurm bridge (docs/slurm.md).

The portal's URL and the pool's bridge token come from GPUPORTAL_URL and GPUPORTAL_BRIDGE_TOKEN (or the flags);
Slurm's commands find their cluster as usual (SLURM_CONF, munge)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from workers.logredact import mask_handlers
from workers.slurm_bridge.bridge import Bridge, run_forever
from workers.slurm_bridge.client import PortalClient
from workers.slurm_bridge.slurm import Slurm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.slurm_bridge")
    parser.add_argument("--pool", required=True)
    parser.add_argument("--portal", default=os.environ.get("GPUPORTAL_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("GPUPORTAL_BRIDGE_TOKEN", ""))
    parser.add_argument("--partition", default="")
    spool = os.environ.get("SLURM_BRIDGE_SPOOL", "/var/spool/gpuportal-slurm")
    # Job output is written there: a directory every Slurm node and this host share.
    parser.add_argument("--spool", default=spool, help="job output directory, shared with the Slurm nodes")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls")
    parser.add_argument("--inventory", type=float, default=60.0, help="seconds between full node inventories")
    parser.add_argument("--usage", type=float, default=60.0, help="seconds between accounting (sacct) syncs")
    parser.add_argument("--models", default="{}", help='GRES type -> portal model, e.g. {"a100": "A100-80GB"}')
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a bridge token is required (GPUPORTAL_BRIDGE_TOKEN or --token)")
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(message)s")
    mask_handlers()
    bridge = Bridge(
        portal=PortalClient(url=args.portal, pool=args.pool, token=args.token),
        slurm=Slurm(partition=args.partition),
        spool=Path(args.spool),
        inventory_every_s=args.inventory,
        usage_every_s=args.usage,
        models=dict(json.loads(args.models)),
    )
    run_forever(bridge, poll_s=args.poll)


if __name__ == "__main__":
    main()

"""GPUs in use outside the portal, and whose processes use them: the Fleet and GPU pages (through the fleet
snapshots) and `GET /api/v1/gpus/` read them here, so both apply the same threshold, grace and redaction.

A whole GPU nothing in the portal holds can still be busy: a process someone started on the node by hand, or one a
finished job left behind. Its latest sample says how much memory is used (keys.OUTSIDE_USE_MIB and more); the
node's process listing says by whom (the agent's per-owner readings, keys.OWNER_MEMORY); a portal user's Unix
account says which user a uid is. Who it is stays with the user's teammates, as a holder's name does; a uid no
portal user has is for admins.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from apps.core.ttlcache import TTLCache
from apps.fleet.selectors import released_within
from apps.identity.selectors import users_of_uids
from apps.telemetry import keys
from apps.telemetry.jobmem import outside_owners

# Who a uid is changes when an admin edits Unix accounts or memberships: read again at most every 10 s, not on
# every snapshot of a GPU someone uses by hand for hours.
_USERS = TTLCache[str, dict[int, tuple[str, list[str]]]](ttl_s=10.0, maxsize=8)


def outside_use(candidates: Mapping[str, tuple[int, int]], *, now: float) -> dict[str, dict[str, Any]]:
    """`candidates`: {GPU uuid: (GPU id, MiB used)}, whole GPUs nothing in the portal holds whose fresh sample
    shows at least keys.OUTSIDE_USE_MIB used. Returns those the portal did not release in the last
    keys.OUTSIDE_GRACE_S (what they show may be the job that just ended there) as {uuid: {"mib": MiB used, "by":
    [{"user", "teams", "mib"} | {"uid", "mib"}, most memory first]}} (keys.SnapshotGpu.outside), unredacted.
    One query on the allocations, and while processes are listed one Redis round trip and at most a query every
    10 s for their owners."""
    if not candidates:
        return {}
    released = released_within(
        [gpu_id for gpu_id, _ in candidates.values()],
        seconds=keys.OUTSIDE_GRACE_S,
        now=datetime.fromtimestamp(now, UTC),
    )
    kept = {uuid: mib for uuid, (gpu_id, mib) in candidates.items() if gpu_id not in released}
    owners = outside_owners(kept, now=now)
    uids = sorted({r.uid for readings in owners.values() for r in readings})
    users = _USERS.get_or_set(",".join(map(str, uids)), lambda: users_of_uids(uids)) if uids else {}
    out: dict[str, dict[str, Any]] = {}
    for uuid, mib in kept.items():
        by: list[dict[str, Any]] = []
        for r in owners.get(uuid, []):
            user = users.get(r.uid)
            if user is None:
                by.append({"uid": r.uid, "mib": r.used_mib})
            else:
                by.append({"user": user[0], "teams": user[1], "mib": r.used_mib})
        out[uuid] = {"mib": mib, "by": by}
    return out


def owner_teams(entry: Mapping[str, Any]) -> list[str]:
    """The teams whose members may see who this owner is: a portal user's own teams. A uid no portal user has, or a
    user in no team, is for admins only: "" is no team's slug (the fleet fan-out counts it as a team nobody but an
    admin is in, so a snapshot that names one is never shown whole to anyone else)."""
    teams = entry.get("teams")
    named = [str(t) for t in teams if t] if "uid" not in entry and isinstance(teams, list) else []
    return named or [""]


def owner_as_seen(entry: Mapping[str, Any], *, see_all: bool, teams: Collection[str]) -> dict[str, Any]:
    """One owner of a GPU's outside use as a viewer sees it: whole for admins and the user's teammates (`teams`: the
    viewer's team slugs), else only the memory."""
    if see_all or any(t in teams for t in owner_teams(entry)):
        return dict(entry)
    return {"mib": entry.get("mib")}

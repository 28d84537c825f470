"""The group sync rules as a plain function: which memberships a sign-in adds, changes and removes.

Rules (docs/identity.md):
- A user's directory groups select the mappings whose `group` is one of them; per team the highest role wins.
- Memberships the sync made (source `directory`) follow the directory: added, changed, removed.
- A membership added by hand (source `manual`) is left alone, unless a mapping of that team has
  `replaces_manual`: then the sync owns it like its own (changes its role, removes it when no group maps).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MANUAL = "manual"
DIRECTORY = "directory"
_RANK = {"member": 1, "manager": 2}


@dataclass(frozen=True)
class Mapping:
    group: str
    team_id: int
    role: str
    replaces_manual: bool = False


@dataclass(frozen=True)
class Held:
    """A membership the user has now."""

    team_id: int
    role: str
    source: str


@dataclass
class SyncPlan:
    add: dict[int, str] = field(default_factory=dict)  # team id -> role
    change: dict[int, str] = field(default_factory=dict)  # team id -> new role (the membership becomes `directory`)
    remove: set[int] = field(default_factory=set)  # team ids

    @property
    def empty(self) -> bool:
        return not (self.add or self.change or self.remove)


def plan_sync(*, groups: Iterable[str], mappings: Iterable[Mapping], held: Iterable[Held]) -> SyncPlan:
    """What to do to a user's memberships so that they follow `groups` under `mappings`."""
    group_set = set(groups)
    all_mappings = list(mappings)
    taken_over = {m.team_id for m in all_mappings if m.replaces_manual}
    wanted: dict[int, str] = {}
    for m in all_mappings:
        if m.group in group_set and _RANK.get(m.role, 0) > _RANK.get(wanted.get(m.team_id, ""), 0):
            wanted[m.team_id] = m.role
    plan = SyncPlan()
    held_by_team = {h.team_id: h for h in held}
    for team_id, role in wanted.items():
        current = held_by_team.get(team_id)
        if current is None:
            plan.add[team_id] = role
        elif (current.source == DIRECTORY or team_id in taken_over) and (
            current.role != role or current.source != DIRECTORY
        ):
            plan.change[team_id] = role
    for team_id, current in held_by_team.items():
        if team_id in wanted:
            continue
        if current.source == DIRECTORY or team_id in taken_over:
            plan.remove.add(team_id)
    return plan

"""Writes for identity: group mappings, users signing in through a provider, the group sync at sign-in, and the
POSIX uid of each user."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.accounts.models import Membership, MembershipSource, Role, Team
from apps.accounts.types import AnyUser, User
from apps.audit.models import AuditEvent
from apps.audit.services import audit_event, audit_record
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.identity import sync
from apps.identity.models import UID_MAX, ExternalIdentity, GroupMapping, UnixAccount, UnixAccountSource

logger = logging.getLogger(__name__)


def group_mapping_create(
    *, actor: AnyUser | None, group: str, team: str, role: str = Role.MEMBER, replaces_manual: bool = False
) -> GroupMapping:
    """Map a directory group to a team (by slug) and role. Takes effect at each member's next sign-in."""
    group = (group or "").strip()
    if not group or len(group) > 255:
        raise ValidationFailed("Give the group's name, 1-255 characters.", fields={"group": ["1-255 characters."]})
    if role not in Role.values:
        raise ValidationFailed(f"Unknown role {role!r}.", fields={"role": [f"One of: {', '.join(Role.values)}."]})
    team_row = Team.objects.filter(slug=team).first()
    if team_row is None:
        raise ValidationFailed(f"No team {team!r}.", fields={"team": ["No such team."]})
    try:
        with transaction.atomic():
            mapping = GroupMapping.objects.create(
                group=group, team=team_row, role=role, replaces_manual=replaces_manual
            )
            audit_record(
                actor=actor,
                action="group_mapping.create",
                target=mapping,
                team=team_row,
                data={"group": group, "role": role, "replaces_manual": replaces_manual},
            )
    except IntegrityError as exc:
        raise Conflict(f"Group {group!r} is already mapped to team {team!r}.") from exc
    return mapping


def group_mapping_delete(*, actor: AnyUser | None, mapping_id: int) -> None:
    """Remove a mapping. Memberships it made go at each member's next sign-in (the sync no longer wants them)."""
    with transaction.atomic():
        mapping = GroupMapping.objects.select_for_update().select_related("team").filter(pk=mapping_id).first()
        if mapping is None:
            raise NotFound("No such group mapping.")
        audit_record(
            actor=actor,
            action="group_mapping.delete",
            target=mapping,
            team=mapping.team,
            data={"group": mapping.group, "role": mapping.role},
        )
        mapping.delete()


def directory_sync(*, user: User, groups: Iterable[str], via: str) -> sync.SyncPlan:
    """Make the user's team memberships follow their directory groups (rules in apps/identity/sync.py).

    Locks the user's row (SELECT ... FOR UPDATE) so two sign-ins of the same person at once apply one plan after
    the other: locking only their memberships would let both add the same new one."""
    group_list = sorted(set(groups))
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=user.pk).values_list("pk").first()
        held_rows = list(Membership.objects.filter(user=user))
        mappings = [
            sync.Mapping(group=m.group, team_id=m.team_id, role=m.role, replaces_manual=m.replaces_manual)
            for m in GroupMapping.objects.all()
        ]
        plan = sync.plan_sync(
            groups=group_list,
            mappings=mappings,
            held=[sync.Held(team_id=m.team_id, role=m.role, source=m.source) for m in held_rows],
        )
        if plan.empty:
            return plan
        teams = Team.objects.in_bulk(set(plan.add) | set(plan.change) | plan.remove)
        Membership.objects.bulk_create(
            [
                Membership(user=user, team_id=team_id, role=role, source=MembershipSource.DIRECTORY)
                for team_id, role in plan.add.items()
            ]
        )
        for team_id, role in plan.change.items():
            Membership.objects.filter(user=user, team_id=team_id).update(role=role, source=MembershipSource.DIRECTORY)
        if plan.remove:
            Membership.objects.filter(user=user, team_id__in=plan.remove).delete()
        for action, team_ids in (
            ("membership.directory_add", plan.add),
            ("membership.directory_change", plan.change),
            ("membership.directory_remove", plan.remove),
        ):
            for team_id in sorted(team_ids):
                new_role = plan.add.get(team_id) or plan.change.get(team_id)
                audit_record(
                    actor=None,
                    action=action,
                    target=user,
                    team=teams[team_id],
                    data={"via": via, "role": new_role, "groups": group_list},
                )
    return plan


def _identity_link(*, issuer: str, subject: str) -> ExternalIdentity | None:
    qs = ExternalIdentity.objects.select_for_update().select_related("user")
    return qs.filter(issuer=issuer, subject=subject).first()


_USERNAME_BAD = re.compile(r"[^\w.@+-]")


def _free_username(wanted: str) -> str:
    base = _USERNAME_BAD.sub("-", wanted)[:140] or "user"
    taken = set(User.objects.filter(username__istartswith=base).values_list("username", flat=True))
    taken_lower = {name.lower() for name in taken}
    if base.lower() not in taken_lower:
        return base
    n = 2
    while f"{base}-{n}".lower() in taken_lower:
        n += 1
    return f"{base}-{n}"


def oidc_user_sign_in(*, issuer: str, claims: Mapping[str, object]) -> User:
    """The user for a verified OIDC subject: found by (issuer, sub), created on the first sign-in.

    Never matched by e-mail or username: a provider account cannot take over a local one (the break-glass admins)
    by carrying the same address. Names and e-mail follow the provider on each sign-in."""
    subject = str(claims["sub"])
    email = str(claims.get("email") or "")[:254]
    first_name = str(claims.get("given_name") or "")[:150]
    last_name = str(claims.get("family_name") or "")[:150]
    try:
        with transaction.atomic():
            if _identity_link(issuer=issuer, subject=subject) is None:
                wanted = str(claims.get("preferred_username") or email.split("@")[0] or subject)
                user = User(username=_free_username(wanted))
                user.set_unusable_password()
                user.email, user.first_name, user.last_name = email, first_name, last_name
                user.save()
                ExternalIdentity.objects.create(user=user, issuer=issuer, subject=subject)
                audit_record(actor=None, action="user.create", target=user, data={"via": "oidc", "issuer": issuer})
    except IntegrityError:
        # Another first sign-in of the same subject (two tabs) made the link first: its account is used below.
        pass
    with transaction.atomic():
        link = _identity_link(issuer=issuer, subject=subject)
        if link is None:
            raise Conflict("The account for this sign-in could not be created. Try again.")
        user = link.user
        if (user.email, user.first_name, user.last_name) != (email, first_name, last_name):
            user.email, user.first_name, user.last_name = email, first_name, last_name
            user.save(update_fields=["email", "first_name", "last_name"])
        link.last_login_at = timezone.now()
        link.save(update_fields=["last_login_at"])
    return user


def _uid_taken(uid: int) -> ValidationFailed:
    return ValidationFailed(f"uid {uid} belongs to another portal user.", fields={"uid": ["Taken by another user."]})


def unix_uid_set(*, user: User, uid: int | None, source: str, actor: AnyUser | None = None) -> UnixAccount | None:
    """Say which POSIX uid the user's processes run as on the GPU nodes (None: no uid, the mapping is removed).

    One user per uid, never root. Locks the user's row (SELECT ... FOR UPDATE) so two sign-ins of the same person
    at once change their one account in turn; two users claiming one uid at once are parted by the unique index,
    whose violation is refused like a uid seen taken. Rewrites nothing when the uid and its source are unchanged,
    so a sign-in that confirms the uid leaves `updated_at` and the audit log as they were."""
    if source not in UnixAccountSource.values:
        raise ValidationFailed(
            f"Unknown source {source!r}.", fields={"source": [f"One of: {', '.join(UnixAccountSource.values)}."]}
        )
    if uid is None:
        with transaction.atomic():
            User.objects.select_for_update().filter(pk=user.pk).values_list("pk").first()
            account = UnixAccount.objects.filter(user=user).first()
            if account is not None:
                audit_record(actor=actor, action="unix_account.delete", target=user, data={"uid": account.uid})
                account.delete()
        return None
    if isinstance(uid, bool) or not isinstance(uid, int) or not 0 < uid <= UID_MAX:
        raise ValidationFailed(
            f"uid must be a whole number from 1 to {UID_MAX}; 0 is root.", fields={"uid": [f"1 to {UID_MAX}."]}
        )
    try:
        with transaction.atomic():
            User.objects.select_for_update().filter(pk=user.pk).values_list("pk").first()
            account = UnixAccount.objects.filter(user=user).first()
            previous = account.uid if account is not None else None
            if account is not None and (account.uid, account.source) == (uid, source):
                return account
            if UnixAccount.objects.filter(uid=uid).exclude(user=user).exists():
                raise _uid_taken(uid)
            if account is None:
                account = UnixAccount.objects.create(user=user, uid=uid, source=source)
            else:
                account.uid, account.source = uid, source
                account.save(update_fields=["uid", "source", "updated_at"])
            audit_record(
                actor=actor,
                action="unix_account.set",
                target=user,
                data={"uid": uid, "previous": previous, "source": source},
            )
    except IntegrityError as exc:
        # The user's row lock rules out a second account for them, and the range is checked above: what is left
        # is the uid's unique index, taken by another user's write that committed after the check.
        raise _uid_taken(uid) from exc
    return account


def unix_uid_from_directory(*, user: User, value: object, source: str) -> None:
    """Store the uid a directory or identity provider gives the user at sign-in (a number, or its digits as text).
    None or a value that is no number leaves the portal's uid as it is, and a uid another portal user holds is not
    stored (a warning is logged): the sign-in itself goes on either way, since a uid only says whose GPU processes
    are whose."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        uid = int(str(value).strip())
    except ValueError:
        return
    try:
        unix_uid_set(user=user, uid=uid, source=source)
    except ValidationFailed as exc:
        logger.warning("%s sign-in of %s: uid %s not stored: %s", source, user.username, uid, exc.detail)


MAX_UIDS_PER_LOAD = 10_000


def unix_uids_load(
    *, actor: AnyUser, entries: Sequence[tuple[str, int | None]], skip_unknown: bool = False
) -> tuple[int, list[str]]:
    """Set many users' POSIX uids at once, by an administrator (the REST API's bulk load): (username, uid or None
    to remove), all or nothing. Returns how many users' uids changed, and the usernames skipped: with
    `skip_unknown` (a node's whole account list, most of it no portal user) an unknown user is left out, else it
    fails the load.

    The request is judged as a whole: each user and each uid once in it, every user known, every uid in range and
    not held by a user outside it. Within it uids may move between users (a swap is one load): the accounts that
    change are removed before the new ones are written, under the locks of all the users' rows (taken in id order,
    so two loads cannot deadlock), and the uid's unique index parts a load from a concurrent claim by anyone else,
    refused like a uid seen taken. Each change is audited as `unix_uid_set` audits it."""
    if len(entries) > MAX_UIDS_PER_LOAD:
        raise ValidationFailed(f"At most {MAX_UIDS_PER_LOAD} accounts per request.", fields={"accounts": ["Too many."]})
    wanted = {name: uid for name, uid in entries}
    problems: list[str] = []
    twice = sorted(name for name, n in Counter(name for name, _ in entries).items() if n > 1)
    if twice:
        problems.append("Each user at most once: " + _listed(twice) + ".")
    uids = [uid for uid in wanted.values() if uid is not None]
    for uid in uids:
        if isinstance(uid, bool) or not isinstance(uid, int) or not 0 < uid <= UID_MAX:
            problems.append(f"uid {uid}: a whole number from 1 to {UID_MAX} (0 is root).")
    repeated = sorted(uid for uid, n in Counter(uids).items() if n > 1)
    if repeated:
        problems.append("Each uid at most once: " + _listed(repeated) + ".")
    users = {u.username: u for u in User.objects.filter(username__in=list(wanted))}
    unknown = sorted(set(wanted) - set(users))
    if unknown and not skip_unknown:
        problems.append("No such user: " + _listed(unknown) + ".")
    if problems:
        raise ValidationFailed(" ".join(problems), fields={"accounts": problems})
    by_id = {users[name].pk: (users[name], uid) for name, uid in wanted.items() if name in users}
    uids = [uid for _, uid in by_id.values() if uid is not None]
    try:
        with transaction.atomic():
            list(User.objects.select_for_update().filter(pk__in=list(by_id)).order_by("pk").values_list("pk"))
            current = {a.user_id: a for a in UnixAccount.objects.filter(user_id__in=list(by_id))}
            taken = sorted(
                UnixAccount.objects.filter(uid__in=uids).exclude(user_id__in=list(by_id)).values_list("uid", flat=True)
            )
            if taken:
                detail = "Held by users not in this request: uid " + _listed(taken) + "."
                raise ValidationFailed(detail, fields={"accounts": [detail]})
            changes: list[tuple[User, int | None, int | None]] = []  # (user, new uid, previous uid)
            for pk, (user, new_uid) in sorted(by_id.items()):
                old = current.get(pk)
                if (None if old is None else (old.uid, old.source)) != (
                    None if new_uid is None else (new_uid, UnixAccountSource.MANUAL)
                ):
                    changes.append((user, new_uid, None if old is None else old.uid))
            UnixAccount.objects.filter(
                user_id__in=[u.pk for u, _, previous in changes if previous is not None]
            ).delete()
            UnixAccount.objects.bulk_create(
                [
                    UnixAccount(user=u, uid=new_uid, source=UnixAccountSource.MANUAL)
                    for u, new_uid, _ in changes
                    if new_uid
                ]
            )
            events = [
                audit_event(actor=actor, action="unix_account.delete", target=user, data={"uid": previous})
                if new_uid is None
                else audit_event(
                    actor=actor,
                    action="unix_account.set",
                    target=user,
                    data={"uid": new_uid, "previous": previous, "source": UnixAccountSource.MANUAL.value},
                )
                for user, new_uid, previous in changes
            ]
            AuditEvent.objects.bulk_create(events)  # a node's whole account list is thousands of rows: one INSERT
    except IntegrityError as exc:
        # Every user in the load is locked and its old accounts are gone: a violation is a uid that someone outside
        # the load claimed after the check above.
        detail = "A uid in this request was taken by another user meanwhile; nothing was changed."
        raise ValidationFailed(detail, fields={"accounts": [detail]}) from exc
    return len(changes), unknown


def _listed(items: Sequence[object], most: int = 20) -> str:
    """The first `most` items for a message, and how many more: a load of thousands stays a readable refusal."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(map(str, items[:most])) + more

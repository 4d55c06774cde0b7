"""Reviewer groups: the named people a `require` rule hands a call to ("finance approves
refunds over 1,000").

A group is a set of the org's members. A rule with `outcome = require` and a
`reviewer_group` opens its approval requests bound to the group: only the group's members
may approve them (403 `not_in_reviewer_group` for anyone else), `approvals_required` of them
when the rule asks for several. Anyone who may decide may still reject: refusing is the safe
direction, and a reviewer who sees something wrong must be able to stop it. A grant never
decides a call that waits for a group (the grant's issuer is not known to be in it).

Membership is read when a person approves, not when the request opens, so adding someone to
the group lets them decide requests that are already waiting. A group used by a rule or by a
pending request cannot be deleted (409 `reviewer_group_in_use`): its requests would be left
with nobody allowed to approve them (a request whose group is gone anyway, by a race, fails
closed: it can only be rejected or expire). Every edit is recorded as a `reviewer_group.changed`
event, which the audit chain seals.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from orgs.models import Event, Membership, Organization

MAX_GROUPS_PER_ORG = 100


class ReviewerGroupQuerySet(models.QuerySet):
    def for_org(self, org: Organization) -> ReviewerGroupQuerySet:
        return self.filter(org=org)


class ReviewerGroup(models.Model):
    """A named set of an org's members that `require` rules hand calls to."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="reviewer_groups")
    name = models.SlugField(max_length=64, help_text="How rules and reviewers name it, e.g. finance.")
    description = models.CharField(max_length=500, blank=True)
    members = models.ManyToManyField(Membership, blank=True, related_name="reviewer_groups",
                                     help_text="Members of the organization who may approve for the group.")
    created = models.DateTimeField(default=timezone.now, editable=False)
    updated = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=200, blank=True)

    objects = ReviewerGroupQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="reviewer_group_name_unique_in_org")]

    def __str__(self) -> str:
        return self.name

    # ------------------------------------------------------------ reading

    def member_names(self) -> list[str]:
        """Sorted usernames, from `prefetch_related("members__user")` when the caller made it."""
        members = getattr(self, "_prefetched_objects_cache", {}).get("members")
        if members is None:
            members = self.members.select_related("user")
        return sorted(member.user.username for member in members)

    def settings(self) -> dict[str, Any]:
        """What an edit records, from → to."""
        return {"name": self.name, "description": self.description, "members": self.member_names()}

    def has_member(self, user: Any) -> bool:
        return user is not None and self.members.filter(user_id=user.pk).exists()

    def as_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "name": self.name, "description": self.description,
                "members": self.member_names(), "created": self.created.isoformat(),
                "updated": self.updated.isoformat(), "updated_by": self.updated_by or None}

    def in_use(self) -> str | None:
        """Why the group cannot be deleted, or None."""
        rules = sorted(self.rules.values_list("name", flat=True))
        if rules:
            return f"rule(s) {', '.join(rules)} hand calls to it"
        pending = self.approval_requests.filter(state="pending").count()  # decided ones keep the name
        if pending:
            return f"{pending} pending request(s) wait for its members"
        return None

    # ------------------------------------------------------------ edits, each recorded

    @classmethod
    def add(cls, org: Organization, name: str, description: str, members: list[Membership],
            actor: str) -> ReviewerGroup:
        with transaction.atomic():
            group = cls.objects.create(org=org, name=name, description=description, updated_by=actor)
            group.members.set(members)
            group.recorded(None, group.settings(), actor)
        return group

    def change(self, changes: dict[str, Any], actor: str) -> None:
        """Rename, describe, or set the members; records who changed what (from → to)."""
        before = self.settings()
        with transaction.atomic():
            for name in ("name", "description"):
                if name in changes:
                    setattr(self, name, changes[name])
            if "members" in changes:
                self.members.set(changes["members"])
            after = self.settings()
            if after == before:
                return
            self.updated_by = actor
            self.save()
            self.recorded(before, after, actor)

    def recorded(self, before: dict[str, Any] | None, after: dict[str, Any], actor: str) -> None:
        """Record a saved edit (the API's or the admin's; `before` None: created): who, and each
        setting from → to. A rename also bumps the org's config version: cached rules carry the
        name their requests are labelled with."""
        diff = {name: [None if before is None else before[name], value] for name, value in after.items()
                if before is None or before[name] != value}
        if not diff:
            return
        if before is not None and "name" in diff:
            Organization.objects.filter(pk=self.org_id).update(config_version=F("config_version") + 1)
        self._record("created" if before is None else "changed", diff, actor)

    def remove(self, actor: str) -> None:
        with transaction.atomic():
            self._record("deleted", {"name": [self.name, None], "members": [self.member_names(), None]}, actor)
            self.delete()

    def _record(self, action: str, diff: dict[str, Any], actor: str) -> None:
        Event.record(self.org, "reviewer_group.changed", group=str(self.id), name=self.name, action=action,
                     by=actor, changes=diff)

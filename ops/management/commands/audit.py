"""`manage.py audit verify [--org SLUG]` and `manage.py audit seal [--org SLUG]`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ops import audit
from ops.management import orgs_named


class Command(BaseCommand):
    help = "Verify (re-walk) or seal the orgs' audit chains. verify exits 1 at the first broken link."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["verify", "seal"])
        parser.add_argument("--org", help="The org's slug (default: every org).")

    def handle(self, *args, action: str, org: str | None = None, **options) -> None:
        orgs = orgs_named(org)
        broken = 0
        for each in orgs:
            if action == "seal":
                self.stdout.write(f"{each.slug}: sealed {audit.seal(each.id)} record(s)")
                continue
            found = audit.verify(each)
            if found is None:
                chain = each.audit_chain if hasattr(each, "audit_chain") else None
                self.stdout.write(f"{each.slug}: ok, {chain.seq if chain else 0} record(s), "
                                  f"{audit.backlog(each)} event(s) not sealed yet")
            else:
                broken += 1
                self.stdout.write(f"{each.slug}: BROKEN at {found}")
        if broken:
            raise CommandError(f"{broken} audit chain(s) broken", returncode=1)

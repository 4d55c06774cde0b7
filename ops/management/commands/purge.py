"""`manage.py purge [--dry-run] [--org SLUG]`: what the hourly beat task does, by hand."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from ops import retention
from ops.management import orgs_named


class Command(BaseCommand):
    help = "Archive (JSON Lines under UNDOLOG_ARCHIVE_DIR) then delete what is past each org's retention."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would go; archive and delete nothing.")
        parser.add_argument("--org", help="The org's slug (default: every org).")

    def handle(self, *args, dry_run: bool = False, org: str | None = None, **options) -> None:
        orgs = orgs_named(org)
        verb = "would archive and delete" if dry_run else "archived and deleted"
        for each in orgs:
            counts = retention.purge(each, dry_run=dry_run)
            listed = ", ".join(f"{n} {name}" for name, n in counts.items())
            where = "" if dry_run else f" (archive: {retention.archive_dir(each)})"
            self.stdout.write(f"{each.slug}: {verb} {listed}{where}")

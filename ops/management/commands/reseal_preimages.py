"""`manage.py reseal_preimages [--dry-run]`: after a seal key rotation, every kept pre-image sealed
again under the current `UNDOLOG_SEAL_KEY`, so that the old key can leave `UNDOLOG_SEAL_KEYS_OLD`.

The rotation: the new key in UNDOLOG_SEAL_KEY and the old one in UNDOLOG_SEAL_KEYS_OLD (every
process: web, worker), then this command, then the old key dropped. Safe to run while the server
runs and to run again: a pre-image under the current key is left alone, one dropped meanwhile
stays dropped, and one kept meanwhile is sealed with the current key already. Exits 1 if some
pre-image no configured key opens (its key was dropped too early): those cannot be restored.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.seal import SealError, is_current
from effects.models import PreImage


class Command(BaseCommand):
    help = "Seal every kept pre-image again under the current UNDOLOG_SEAL_KEY (after a key rotation)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would be resealed; change nothing.")

    def handle(self, *args, dry_run: bool = False, **options) -> None:
        resealed = current = 0
        unreadable: list[str] = []
        for kept in PreImage.objects.sealed().only("id", "sealed", "dropped_at").order_by("pk").iterator(
                chunk_size=200):
            try:
                changed = _would_reseal(kept) if dry_run else kept.reseal()
            except SealError:
                unreadable.append(str(kept.pk))
                continue
            resealed += changed
            current += not changed
        verb = "would reseal" if dry_run else "resealed"
        self.stdout.write(f"{verb} {resealed} pre-images; {current} under the current key already "
                          f"(or dropped meanwhile); {len(unreadable)} that no configured key opens")
        if unreadable:
            raise CommandError(f"no configured seal key opens pre-images {', '.join(unreadable[:20])}"
                               f"{' …' if len(unreadable) > 20 else ''}: they cannot be restored")


def _would_reseal(kept: PreImage) -> bool:
    if is_current(bytes(kept.sealed)):
        return False
    kept.value()  # raises SealError when no key opens it
    return True

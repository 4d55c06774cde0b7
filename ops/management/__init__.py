"""What the ops commands share."""

from django.core.management.base import CommandError

from orgs.models import Organization


def orgs_named(slug: str | None):
    """Every org by slug, or the one `--org` names (an unknown slug is a CommandError)."""
    orgs = Organization.objects.order_by("slug")
    if slug:
        orgs = orgs.filter(slug=slug)
        if not orgs.exists():
            raise CommandError(f"No organization with the slug {slug!r}.")
    return orgs

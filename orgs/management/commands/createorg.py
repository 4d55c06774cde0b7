from django.core.management.base import BaseCommand, CommandError

from orgs.models import Organization


class Command(BaseCommand):
    help = "Create an organization (a tenant)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--time-zone", default="UTC")

    def handle(self, slug: str, name: str, time_zone: str, **options) -> None:
        org = Organization(slug=slug, name=name or slug, time_zone=time_zone)
        try:
            org.full_clean()
        except Exception as exc:
            raise CommandError(str(exc)) from None
        org.save()
        self.stdout.write(f"Created organization {org.slug} ({org.id})")

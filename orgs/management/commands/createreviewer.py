import getpass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from orgs.models import Membership, Organization


class Command(BaseCommand):
    help = "Create a dashboard user (or update one) with a role in an org."

    def add_arguments(self, parser) -> None:
        parser.add_argument("org_slug")
        parser.add_argument("username")
        parser.add_argument("--password")
        parser.add_argument("--role", choices=[r.value for r in Membership.Role], default="reviewer")
        parser.add_argument("--email", default="")

    def handle(self, org_slug: str, username: str, password: str | None, role: str, email: str, **opts) -> None:
        org = Organization.objects.filter(slug=org_slug).first()
        if org is None:
            raise CommandError(f"No organization {org_slug!r}; create it with createorg first.")
        if password is None:
            password = getpass.getpass(f"Password for {username}: ")
            if password != getpass.getpass("Again: "):
                raise CommandError("The passwords differ.")
        if not password:
            raise CommandError("The password may not be empty.")
        user, _ = get_user_model().objects.get_or_create(username=username, defaults={"email": email})
        user.set_password(password)
        user.save()
        Membership.objects.update_or_create(user=user, org=org, defaults={"role": role})
        self.stdout.write(f"{username} is a {role} of {org.slug}")

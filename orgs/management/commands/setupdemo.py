from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from orgs.models import Agent, AgentKey, Membership, Organization


class Command(BaseCommand):
    help = "First run only: org `demo`, agent `demo-agent` (key printed), admin/admin."

    def handle(self, **options) -> None:
        if Organization.objects.filter(slug="demo").exists():
            self.stdout.write("Demo org exists; its agent key was printed on the first run. Issue a new one on "
                              "the dashboard's Agents page (as admin), or: .venv/bin/python manage.py "
                              "createagent demo demo-agent")
            return
        org = Organization.objects.create(slug="demo", name="Demo")
        agent = Agent.objects.create(org=org, name="demo-agent")
        _, raw = AgentKey.issue(agent, name="make run")
        user_model = get_user_model()
        user = user_model.objects.filter(username="admin").first() or user_model.objects.create_superuser(
            "admin", "admin@localhost", "admin")
        Membership.objects.get_or_create(user=user, org=org, defaults={"role": Membership.Role.ADMIN})
        self.stdout.write("Created org demo, reviewer admin / admin (dashboard and /admin/).")
        self.stdout.write("Agent demo-agent's key (shown once):")
        self.stdout.write(raw)

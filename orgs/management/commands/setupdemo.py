import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from orgs.models import Agent, AgentKey, Membership, Organization


class Command(BaseCommand):
    help = "First run only: org `demo`, agent `demo-agent` (key printed), admin/admin."

    def handle(self, **options) -> None:
        if Organization.objects.filter(slug="demo").exists():
            saved = f"saved in {key_path()}" if key_path().exists() else "printed on the first run"
            self.stdout.write(f"Demo org exists; its agent key was {saved}. Issue a new one on "
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
        path = save_key(raw)
        self.stdout.write("Created org demo, reviewer admin / admin (dashboard and /admin/).")
        self.stdout.write(f"Agent demo-agent's key (saved to {path}, readable by you only):")
        self.stdout.write(raw)


def key_path() -> Path:
    """Where `make run` keeps the demo agent's key, so its summary can show it on every start."""
    return Path(settings.UNDOLOG_DEMO_KEY_FILE)


def save_key(raw: str) -> Path:
    path = key_path()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(raw + "\n")
    return path

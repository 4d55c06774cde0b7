"""Server-side setup for the demo, run in its own process next to the server's database:

    python -m sdk.demo.provision [--migrate]

Makes sure the org `demo` exists with the admin `admin` / `admin` (as `make run`'s
`setupdemo` does), adds the agent `cleanup` with a fresh key and the reviewer `alice`,
and prints one JSON object: the agent key, the admin's and alice's API tokens and the
org's webhook secret. This is the one part of the demo that is not the SDK: an agent
key and people come from the server's admin, not from the API.
"""

from __future__ import annotations

import io
import json
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from orgs.models import Agent, AgentKey, Membership, Organization
    from rest_framework.authtoken.models import Token

    if "--migrate" in argv:
        call_command("migrate", verbosity=0, interactive=False)
    if not Organization.objects.filter(slug="demo").exists():
        call_command("setupdemo", stdout=io.StringIO())  # org demo, demo-agent, admin/admin
    org = Organization.objects.get(slug="demo")
    users = get_user_model().objects
    admin = users.filter(username="admin").first() or users.create_superuser("admin", "", "admin")
    Membership.objects.get_or_create(user=admin, org=org, defaults={"role": Membership.Role.ADMIN})
    alice, created = users.get_or_create(username="alice", defaults={"email": "alice@example.com"})
    if created:
        alice.set_unusable_password()  # she decides through the API with her token
        alice.save()
    Membership.objects.get_or_create(user=alice, org=org,
                                     defaults={"role": Membership.Role.REVIEWER})
    agent, _ = Agent.objects.get_or_create(org=org, name="cleanup")
    _, key = AgentKey.issue(agent, name="make demo")
    print(json.dumps({
        "org": org.slug, "agent": agent.name, "agent_key": key,
        "admin_token": Token.objects.get_or_create(user=admin)[0].key,
        "reviewer_token": Token.objects.get_or_create(user=alice)[0].key,
        "webhook_secret": org.webhook_secret,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

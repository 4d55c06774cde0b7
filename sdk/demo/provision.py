"""Server-side setup for the demo, run in its own process next to the server's database:

    python -m sdk.demo.provision [--migrate] [--key-name NAME]

Makes sure the demo's own org `cleanup-demo` exists (not `make run`'s tour org `demo`,
whose tools the demo would otherwise overwrite) with the admin `admin` / `admin` (the same
person as `make run`'s `setupdemo` makes), adds the agent `cleanup` with a fresh key (named NAME,
"make demo" unless given; the previous key of that name is revoked) and the reviewer `alice`,
and prints one JSON object: the agent key, the admin's and alice's API tokens and the
org's webhook secret. This is the one part of the demo that is not the SDK: an agent
key and people come from the server's admin, not from the API.
"""

from __future__ import annotations

import json
import os
import sys

ORG = "cleanup-demo"


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
    org, _ = Organization.objects.get_or_create(slug=ORG, defaults={"name": "Cleanup demo"})
    users = get_user_model().objects
    admin = (users.filter(username="admin").first()
             or users.create_superuser("admin", "admin@localhost", "admin"))
    Membership.objects.get_or_create(user=admin, org=org, defaults={"role": Membership.Role.ADMIN})
    alice, created = users.get_or_create(username="alice", defaults={"email": "alice@example.com"})
    if created:
        alice.set_unusable_password()  # she decides through the API with her token
        alice.save()
    Membership.objects.get_or_create(user=alice, org=org,
                                     defaults={"role": Membership.Role.REVIEWER})
    agent, _ = Agent.objects.get_or_create(org=org, name="cleanup")
    # One live key per demo: a rerun (or a retry after a failed run) revokes the one before.
    key_name = argv[argv.index("--key-name") + 1] if "--key-name" in argv else "make demo"
    for earlier in AgentKey.objects.live().filter(agent=agent, name=key_name):
        earlier.revoke()
    _, key = AgentKey.issue(agent, name=key_name)
    print(json.dumps({
        "org": org.slug, "agent": agent.name, "agent_key": key,
        "admin_token": Token.objects.get_or_create(user=admin)[0].key,
        "reviewer_token": Token.objects.get_or_create(user=alice)[0].key,
        "webhook_secret": org.webhook_secret,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

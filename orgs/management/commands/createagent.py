from django.core.management.base import BaseCommand, CommandError

from orgs.models import Agent, AgentKey, Organization


class Command(BaseCommand):
    help = "Create an agent in an org (or add a key to an existing one); prints the key last."

    def add_arguments(self, parser) -> None:
        parser.add_argument("org_slug")
        parser.add_argument("agent_name")

    def handle(self, org_slug: str, agent_name: str, **options) -> None:
        org = Organization.objects.filter(slug=org_slug).first()
        if org is None:
            raise CommandError(f"No organization {org_slug!r}; create it with createorg first.")
        agent, created = Agent.objects.get_or_create(org=org, name=agent_name)
        _, raw = AgentKey.issue(agent, name="createagent")
        verb = "Created agent" if created else "Added a key to agent"
        self.stdout.write(f"{verb} {org.slug}/{agent.name}. The key is shown once; store it now:")
        self.stdout.write(raw)

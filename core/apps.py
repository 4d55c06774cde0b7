from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Plumbing below the apps (no models): outbound signed HTTP with the SSRF rule, the event
    fan-out to an org's Channels group, and the one retry backoff. Every app may import core;
    core imports no app."""

    name = "core"

    def ready(self) -> None:
        from core import checks  # registers the deploy check of the seal key

        checks.warn_at_start()

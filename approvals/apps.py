from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the event_recorded receiver that fans events out (Channels, webhooks, email);
        # imported here: an AppConfig module is imported before the models are ready.
        from approvals import notify  # noqa: F401

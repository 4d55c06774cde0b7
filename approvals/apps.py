from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the event_recorded receiver that fans events out (Channels, webhooks, email).
        from approvals import executor, notify  # noqa: F401
        from deliveries import send

        # An executor delivery moves its effect before the POST and commits or fails it after.
        send.register("executor", start=executor.start, settled=executor.settled)

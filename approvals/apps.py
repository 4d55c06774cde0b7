from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Connects the event_recorded receiver that fans events out (Channels, webhooks, email);
        # imported here: an AppConfig module is imported before the models are ready.
        from approvals import notify, slack, tasks  # noqa: F401

        # A Slack message out of step: the worker posts or updates it (the fan-out signals it, as
        # the tasks that import the fan-out cannot be imported by it).
        slack.message_due.connect(tasks.on_slack_message_due, dispatch_uid="approvals.on_slack_message_due")

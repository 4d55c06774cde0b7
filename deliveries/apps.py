from django.apps import AppConfig


class DeliveriesConfig(AppConfig):
    """The outbox's sending half: every outgoing call that must not be lost (org webhooks'
    events, executors, escalations, emails) is a `Delivery` row with its attempts, sent by
    one claim, one backoff, one sweep. Imports `orgs` and `core` only: the apps that queue
    rows register what is special about their purpose (`deliveries.send.register`)."""

    name = "deliveries"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: the tasks import the models, which are not loaded when this module is.
        from deliveries import tasks
        from deliveries.models import delivery_due

        # A row to send now: enqueue its delivery (the models and the sender signal it, as the
        # task's module imports them).
        delivery_due.connect(tasks.on_delivery_due, dispatch_uid="deliveries.on_delivery_due")

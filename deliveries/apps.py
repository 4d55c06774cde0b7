from django.apps import AppConfig


class DeliveriesConfig(AppConfig):
    """The outbox's sending half: every outgoing call that must not be lost (org webhooks'
    events, executors, escalations, emails) is a `Delivery` row with its attempts, sent by
    one claim, one backoff, one sweep. Imports `orgs` and `core` only: the apps that queue
    rows register what is special about their purpose (`deliveries.send.register`)."""

    name = "deliveries"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class OpsConfig(AppConfig):
    """What an operator runs undolog with: `/metrics`, the tamper-evident audit chain and its
    export, retention (archive, then delete)."""

    name = "ops"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: an AppConfig module is imported before the models are ready.
        from ops import metrics
        from orgs.models import event_recorded, events_recorded

        event_recorded.connect(metrics.on_event, dispatch_uid="ops.metrics.on_event")
        events_recorded.connect(metrics.on_events, dispatch_uid="ops.metrics.on_events")

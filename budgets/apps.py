from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    name = "budgets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: an AppConfig module is imported before the models are ready.
        from budgets import runs
        from effects.models import session_ended

        # The end of a run applies its budget verdict, in the run's own transaction.
        session_ended.connect(runs.on_session_ended, dispatch_uid="budgets.on_session_ended")

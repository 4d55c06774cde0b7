from django.apps import AppConfig


class LifecycleConfig(AppConfig):
    """The workflows of a run that join the apps below it (lifecycle/README.md); no models of its own."""

    name = "lifecycle"

    def ready(self) -> None:
        # Imported here: the workflows import models, which are not loaded when this module is.
        from deliveries import send
        from effects.models import undo_one_due, walk_due
        from lifecycle import executor, rollback, tasks

        # A compensating run has entries to walk: enqueue it (effects signals it, not imports it).
        walk_due.connect(tasks.on_walk_due, dispatch_uid="lifecycle.on_walk_due")
        # A fleet rollback's runs, a chunk walked side by side (lifecycle/rollback.py).
        rollback.fleet_walk_due.connect(tasks.on_fleet_walk_due, dispatch_uid="lifecycle.on_fleet_walk_due")
        # A rejected flagged call: undo it alone (lifecycle/flagged.py).
        undo_one_due.connect(tasks.on_undo_one_due, dispatch_uid="lifecycle.on_undo_one_due")
        # An executor delivery moves its effect before the POST and commits or fails it after.
        send.register("executor", start=executor.start, settled=executor.settled)

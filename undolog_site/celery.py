"""The Celery app: JSON only, acks_late, settings under the CELERY_ namespace."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init

from core import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")

app = Celery("undolog")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect(weak=False)
def _trace_worker_process(**kwargs) -> None:
    # Each forked worker process sets up its own exporter thread and instrumentation (OTel's advice
    # for prefork pools); a no-op unless tracing is configured (core/tracing.py).
    tracing.setup("undolog-worker")

"""The Celery app: JSON only, acks_late, settings under the CELERY_ namespace."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")

app = Celery("undolog")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

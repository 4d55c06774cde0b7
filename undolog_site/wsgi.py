"""WSGI entry point: serves the REST API (and admin/dashboard pages) from gunicorn."""

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
# Traces, when configured: before Django loads its middleware (the instrumentation adds one).
from core import tracing

tracing.setup("undolog-web")
application = get_wsgi_application()

# Everything loaded so far (Django, the apps, their modules) lives as long as the process: out of
# the collector's sight, a full collection no longer walks it (~100 ms pauses on a page otherwise).
gc.collect()
gc.freeze()

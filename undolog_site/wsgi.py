"""WSGI entry point: serves the REST API (and admin/dashboard pages) from gunicorn."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "undolog_site.settings")
application = get_wsgi_application()

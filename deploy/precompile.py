"""Build step: imports what every role imports at start, so Python writes those modules' bytecode
into the image (the non-root user cannot write it at run time, so each start would compile them
again). Only these: compiling every module of the virtualenv would add ~45 MB for code that never
runs (celery's shell, rich, pygments...)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.update({
    "DJANGO_SETTINGS_MODULE": "undolog_site.settings", "ALLOWED_HOSTS": "build.invalid", "DEBUG": "0",
    "SECRET_KEY": "precompile-only", "UNDOLOG_SEAL_KEY": "precompile-only-seals-nothing-0123456789",
    "REDIS_URL": "redis://unused:6379/0",
    "DATABASE_URL": "postgres://unused@unused:5432/unused", "UNDOLOG_VAR_DIR": "/tmp/build-var"})
sys.dont_write_bytecode = False

import django  # noqa: E402

django.setup()

import celery.apps.beat  # noqa: E402
import celery.apps.worker  # noqa: E402
import celery.bin.celery  # noqa: E402
import celery.concurrency.prefork  # noqa: E402, F401
import gunicorn.app.wsgiapp  # noqa: E402
import gunicorn.workers.gthread  # noqa: E402, F401
import uvicorn.loops.uvloop  # noqa: E402
import uvicorn.main  # noqa: E402
import uvicorn.protocols.http.httptools_impl  # noqa: E402
import uvicorn.protocols.websockets.websockets_impl  # noqa: E402, F401
from django.core.management import call_command  # noqa: E402
from django.urls import get_resolver  # noqa: E402

import undolog_site.asgi  # noqa: E402
import undolog_site.wsgi  # noqa: E402, F401
from undolog_site.celery import app  # noqa: E402

app.loader.import_default_modules()
get_resolver().url_patterns  # noqa: B018 (every view module)
call_command("check", "--deploy", verbosity=0)

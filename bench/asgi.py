import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from undolog_site.asgi import application  # noqa: F401

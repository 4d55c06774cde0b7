import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from undolog_site.wsgi import application  # noqa: F401  (traces set up there when configured)

"""With DEBUG=0 the session and CSRF cookies are Secure unless UNDOLOG_SECURE_COOKIES=0 (a plain-HTTP
trial reached at an address other than 127.0.0.1 or localhost, where browsers drop Secure cookies);
`check --deploy` says so when they are not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import BASE_DIR

PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "x" * 60, "ALLOWED_HOSTS": "undolog.example.com"}
SHOW = ("import django; django.setup(); from django.conf import settings; "
        "print(settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE)")


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "UNDOLOG_SECURE_COOKIES")}
    return subprocess.run([sys.executable, *args], cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
                          env={**base, "DJANGO_SETTINGS_MODULE": "undolog_site.settings", **PRODUCTION, **env})


@pytest.mark.parametrize("value, secure", [(None, "True True"), ("1", "True True"), ("0", "False False")])
def test_cookies_are_secure_in_production_unless_turned_off(value, secure):
    shown = run("-c", SHOW, **({"UNDOLOG_SECURE_COOKIES": value} if value else {}))
    assert shown.stdout.strip() == secure, shown.stderr[-2000:]


def test_check_deploy_warns_about_cookies_that_are_not_secure():
    plain = run("manage.py", "check", "--deploy", UNDOLOG_SECURE_COOKIES="0")
    assert "security.W012" in plain.stderr and "security.W016" in plain.stderr, plain.stderr[-2000:]

"""A production server seals pre-images with a key of its own (core/checks.py): `check --deploy`
warns when UNDOLOG_SEAL_KEY is missing (the key is then derived from SECRET_KEY), fails when it is
an example value, SECRET_KEY itself or short, and a server started with DEBUG off says the same
in its log."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import BASE_DIR

PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "s" * 60, "ALLOWED_HOSTS": "undolog.example.com",
              "UNDOLOG_SEAL_KEY": "a-random-seal-key-of-its-own-0123456789"}


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "UNDOLOG_SEAL_KEY", "UNDOLOG_SEAL_KEYS_OLD")}
    merged = {**base, "DJANGO_SETTINGS_MODULE": "undolog_site.settings", **PRODUCTION, **env}
    return subprocess.run([sys.executable, *args], cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in merged.items() if v is not None})


def test_check_deploy_warns_when_the_seal_key_is_missing():
    checked = run("manage.py", "check", "--deploy", "--fail-level", "WARNING", UNDOLOG_SEAL_KEY=None)
    assert checked.returncode == 1, checked.stderr[-2000:]
    assert "undolog.W001" in checked.stderr and "derived from SECRET_KEY" in checked.stderr


@pytest.mark.parametrize("key", ["change-me-to-another-long-random-string", "s" * 60, "short-0123456789"])
def test_check_deploy_fails_on_a_seal_key_that_is_not_secret(key):
    checked = run("manage.py", "check", "--deploy", UNDOLOG_SEAL_KEY=key)
    assert checked.returncode == 1, checked.stderr[-2000:]
    assert "undolog.E001" in checked.stderr


def test_check_deploy_says_nothing_of_a_seal_key_of_its_own():
    checked = run("manage.py", "check", "--deploy")
    assert "undolog.W001" not in checked.stderr and "undolog.E001" not in checked.stderr, checked.stderr[-2000:]


def test_a_process_started_with_debug_off_and_no_seal_key_says_so_in_its_log():
    started = run("-c", "import django; django.setup()", UNDOLOG_SEAL_KEY=None)
    assert started.returncode == 0, started.stderr[-2000:]
    assert "undolog.W001" in started.stderr + started.stdout
    quiet = run("-c", "import django; django.setup()")
    assert "undolog.W001" not in quiet.stderr + quiet.stdout

"""Fault injection for the tests that prove nothing is lost when a process dies at the worst
moment. Inert outside tests: `UNDOLOG_TEST_FAULT` is read only when `UNDOLOG_TESTING` is on
(settings.TESTING), and production settings refuse to boot with it."""

from __future__ import annotations

import os
import signal

from django.conf import settings


def hit(point: str, detail: str = "") -> None:
    """SIGKILL this process if the test asked to die at `point` (`point` or `point:detail`)."""
    wanted = settings.UNDOLOG_TEST_FAULT
    if wanted and wanted in (point, f"{point}:{detail}"):
        os.kill(os.getpid(), signal.SIGKILL)

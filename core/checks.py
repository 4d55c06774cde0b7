"""`manage.py check --deploy`: the seal key (core/seal.py) a production server must set.

Without `UNDOLOG_SEAL_KEY` pre-images are sealed with a key derived from SECRET_KEY: it works,
but rotating SECRET_KEY (as one does after a leak) then loses every pre-image kept, and whoever
holds SECRET_KEY opens them. A warning (CI runs `check --deploy --fail-level WARNING`). A key
that cannot be secret (the examples' `change-me…`, SECRET_KEY itself, under 32 characters) is an
error: `check --deploy` fails.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

MIN_LENGTH = 32
HINT = ("Set UNDOLOG_SEAL_KEY to a random string of its own (python3 -c 'import secrets; "
        "print(secrets.token_urlsafe(32))'). Moving off the derived key: UNDOLOG_SEAL_KEYS_OLD="
        "derived:<your SECRET_KEY>, then `manage.py reseal_preimages`, then drop it (README, Bounds and seal).")


def seal_key_problem() -> CheckMessage | None:
    key = settings.UNDOLOG_SEAL_KEY
    if not key:
        return Warning("UNDOLOG_SEAL_KEY is not set: pre-images are sealed with a key derived from SECRET_KEY, "
                       "so rotating SECRET_KEY would make every kept pre-image unreadable (no rollback "
                       "could restore them).", hint=HINT, id="undolog.W001")
    if key.lower().startswith("change-me") or key == settings.SECRET_KEY or len(key) < MIN_LENGTH:
        return Error(f"UNDOLOG_SEAL_KEY is an example value, SECRET_KEY itself, or shorter than {MIN_LENGTH} "
                     "characters: pre-images sealed with it are not secret.", hint=HINT, id="undolog.E001")
    return None


@register(Tags.security, deploy=True)
def check_seal_key(app_configs, **kwargs) -> list[CheckMessage]:
    problem = seal_key_problem()
    return [problem] if problem is not None else []


def warn_at_start() -> None:
    """Every process with DEBUG off says so once at start (the servers run no deploy checks)."""
    problem = seal_key_problem() if not settings.DEBUG else None
    if problem is not None:
        logging.getLogger("undolog").warning("%s: %s %s", problem.id, problem.msg, problem.hint)

"""Sealing values at rest with the server's key (Fernet: AES-128-CBC + HMAC-SHA256).

`UNDOLOG_SEAL_KEY` seals; `UNDOLOG_SEAL_KEYS_OLD` (comma-separated) still unseal, so a key
rotation keeps everything sealed before it readable: set the new key, move the old one to the
old list, and drop it from there once nothing sealed with it is kept (pre-images live only
while their run can be undone). Without `UNDOLOG_SEAL_KEY` the key is derived from SECRET_KEY
for this purpose (as the Slack secrets' is, approvals/models.py): set it in production, so that
rotating SECRET_KEY does not lose what is sealed.

A key is any string: it is stretched with SHA-256 into a Fernet key, so a `secrets.token_urlsafe(32)`
works as well as `Fernet.generate_key()`.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from django.conf import settings

__all__ = ["SealError", "seal", "unseal"]


class SealError(ValueError):
    """A sealed value no configured key opens (its key was dropped from UNDOLOG_SEAL_KEYS_OLD)."""


def _fernet_key(secret: str) -> bytes:
    return base64.urlsafe_b64encode(hashlib.sha256(f"undolog.seal:{secret}".encode()).digest())


@lru_cache(maxsize=4)
def _keys(current: str, old: tuple[str, ...], secret_key: str):
    from cryptography.fernet import Fernet, MultiFernet

    first = current or f"derived:{secret_key}"
    return MultiFernet([Fernet(_fernet_key(first)), *(Fernet(_fernet_key(key)) for key in old)])


def _multi():
    return _keys(settings.UNDOLOG_SEAL_KEY, tuple(settings.UNDOLOG_SEAL_KEYS_OLD), settings.SECRET_KEY)


def seal(value: bytes) -> bytes:
    """`value` encrypted and authenticated with the current key."""
    return _multi().encrypt(value)


def unseal(token: bytes) -> bytes:
    """The value `seal` made, with the current key or any old one."""
    from cryptography.fernet import InvalidToken

    try:
        return _multi().decrypt(bytes(token))
    except InvalidToken:
        raise SealError("no configured seal key opens this value (was its key dropped?)") from None


def reseal(token: bytes) -> bytes:
    """The same value sealed with the current key (after a rotation, before an old key is dropped)."""
    return _multi().rotate(bytes(token))

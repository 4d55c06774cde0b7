"""Sealing values at rest with the server's key (AES-256-GCM, an AEAD).

`UNDOLOG_SEAL_KEY` seals; `UNDOLOG_SEAL_KEYS_OLD` (comma-separated) still unseal, so a key
rotation keeps everything sealed before it readable: set the new key, move the old one to the
old list, run `manage.py reseal_preimages` (everything kept is sealed again under the new key),
then drop the old key. Without `UNDOLOG_SEAL_KEY` the key is derived from SECRET_KEY for this
purpose (as the Slack secrets' is, approvals/models.py): `manage.py check --deploy` warns, as
rotating SECRET_KEY would then lose what is sealed (core/checks.py). That derived key, as an old
key, is `derived:<SECRET_KEY>`.

A key is any string: it is stretched with SHA-256 into the AES key, so `secrets.token_urlsafe(32)`
works as well as `Fernet.generate_key()`.

A sealed value is `0x01 · key id (4 bytes) · nonce (12 bytes) · ciphertext and tag`: the key id
(from a hash of the key, not the key) names the key that opens it, so unsealing tries one key,
not each, and `reseal_preimages` knows what is current without decrypting. AES-GCM seals 10 KiB
in a few microseconds with no encoding step; the Fernet tokens (AES-CBC + HMAC, base64) of
earlier versions are still opened by the same keys.
"""

from __future__ import annotations

import base64
import hashlib
import os
from functools import lru_cache

from django.conf import settings

__all__ = ["SealError", "is_current", "reseal", "seal", "unseal"]

VERSION = b"\x01"
_HEADER = 1 + 4 + 12  # version, key id, nonce


class SealError(ValueError):
    """A sealed value no configured key opens (its key was dropped from UNDOLOG_SEAL_KEYS_OLD)."""


def _secret(secret: str) -> bytes:
    return hashlib.sha256(f"undolog.seal:{secret}".encode()).digest()


class _Keys:
    """The configured keys: the current one first, as AES-GCM ciphers by key id."""

    def __init__(self, secrets: list[str]) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.secrets = secrets
        self.by_id: dict[bytes, AESGCM] = {}
        for secret in secrets:
            key = _secret(secret)
            self.by_id.setdefault(hashlib.sha256(b"undolog.seal.id:" + key).digest()[:4], AESGCM(key))
        self.current = next(iter(self.by_id))
        self.header = VERSION + self.current

    def fernet(self):
        from cryptography.fernet import Fernet, MultiFernet

        return MultiFernet([Fernet(base64.urlsafe_b64encode(_secret(secret))) for secret in self.secrets])


@lru_cache(maxsize=4)
def _keys(current: str, old: tuple[str, ...], secret_key: str) -> _Keys:
    return _Keys([current or f"derived:{secret_key}", *old])


def _configured() -> _Keys:
    return _keys(settings.UNDOLOG_SEAL_KEY, tuple(settings.UNDOLOG_SEAL_KEYS_OLD), settings.SECRET_KEY)


def seal(value: bytes) -> bytes:
    """`value` encrypted and authenticated with the current key."""
    keys = _configured()
    nonce = os.urandom(12)  # random 96-bit nonces: safe far beyond any key's lifetime of pre-images
    header = keys.header + nonce
    return header + keys.by_id[keys.current].encrypt(nonce, value, header[:5])


def unseal(token: bytes) -> bytes:
    """The value `seal` made, with the current key or any old one."""
    from cryptography.exceptions import InvalidTag
    from cryptography.fernet import InvalidToken

    token, keys = bytes(token), _configured()
    if token[:1] != VERSION:  # a Fernet token, sealed before AES-GCM
        try:
            return keys.fernet().decrypt(token)
        except InvalidToken:
            raise SealError("no configured seal key opens this value (was its key dropped?)") from None
    cipher = keys.by_id.get(token[1:5])
    try:
        if cipher is None:
            raise InvalidTag
        return cipher.decrypt(token[5:_HEADER], token[_HEADER:], token[:5])
    except InvalidTag:
        raise SealError("no configured seal key opens this value (was its key dropped?)") from None


def is_current(token: bytes) -> bool:
    """Whether `token` is sealed with the current key (nothing to reseal)."""
    token = bytes(token)
    return token[:1] == VERSION and token[1:5] == _configured().current


def reseal(token: bytes) -> bytes:
    """The same value sealed with the current key (after a rotation, before an old key is dropped)."""
    return seal(unseal(token))

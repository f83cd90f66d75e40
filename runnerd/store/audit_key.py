"""The audit chain's key: the HMAC key each entry's hash is keyed with (``audit.key``).

Apart from the trail itself (store/audit.py) because the store opens it before any table
is read, and the CLI's ``audit verify`` reads it without a store.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runnerd.config import Settings

__all__ = ["audit_key_of", "chain_key", "load_audit_key"]

_CHAIN_LABEL = b"runnerd audit chain v1"  # what a key derived from the secrets key is for


def load_audit_key(path: Path, *, derive_from: bytes | None = None) -> bytes:
    """The chain key in ``path`` (base64 of 32 bytes), created 0600 when missing: derived
    from ``derive_from`` (the secrets key) when given, so that nodes sharing a secrets key
    make the same one, else random. Once written it is kept: rotating the secrets key
    later does not change it."""
    from runnerd.vault import write_key_file

    if not path.exists():
        key = (
            hmac.new(derive_from, _CHAIN_LABEL, hashlib.sha256).digest()
            if derive_from
            else secrets.token_bytes(32)
        )
        # Never replaces a key another process wrote meanwhile: that one is read below.
        with contextlib.suppress(FileExistsError):
            write_key_file(path, key, exclusive=True)
    return base64.b64decode(path.read_text().strip())


def chain_key(audit_path: Path, *, secrets_path: Path, secrets_key: str | None = None) -> bytes:
    """The chain key in ``audit_path``, made the first time from the secrets key (
    ``secrets_key``, base64, else the key file ``secrets_path``, made now if missing, as
    the daemon would make it at start): so a store moved to new nodes with its secrets
    key, or restored beside it, keeps its chain key; a later rotation of the secrets key
    does not change it."""
    if audit_path.exists():
        return load_audit_key(audit_path)
    if secrets_key:
        derive = base64.b64decode(secrets_key)
    else:
        from runnerd.vault import new_key, write_key_file

        if not secrets_path.exists():
            with contextlib.suppress(FileExistsError):
                write_key_file(secrets_path, new_key(), exclusive=True)
        derive = base64.b64decode(secrets_path.read_text().strip())
    return load_audit_key(audit_path, derive_from=derive)


def audit_key_of(settings: Settings) -> bytes:
    """The chain key the settings name: ``audit_key``, else ``chain_key`` of the key
    files they name."""
    if settings.audit_key:
        return base64.b64decode(settings.audit_key)
    return chain_key(
        settings.audit_key_path,
        secrets_path=settings.secrets_key_path,
        secrets_key=settings.secrets_key,
    )

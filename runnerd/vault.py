"""Secrets at rest: AES-256-GCM with a key kept apart from the database.

The key is 32 random bytes, base64 in a 0600 file (``<data dir>/secrets.key`` unless
``secrets_key_file`` says otherwise), or given directly as ``secrets_key`` (base64, from
the config or RUNNERD_SECRETS_KEY). Each ciphertext is bound to its install and name
(GCM associated data), so a row copied onto another install does not decrypt, and
carries the id of its key, so a rotation is checkable row by row.

The cipher (the ``cryptography`` package, about 6 MB of a daemon's memory) is loaded
when a secret is first sealed or opened, or at start (``load``) when the store holds
secrets: a daemon whose installs have none never carries it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from runnerd.errors import VaultError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["Vault", "new_key"]


def new_key() -> bytes:
    return secrets.token_bytes(32)


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"runnerd-secrets-key" + key).hexdigest()[:16]


def _aad(install_id: str, name: str) -> bytes:
    return f"{install_id}\0{name}".encode()


class Vault:
    def __init__(self, key: bytes, key_file: Path | None = None) -> None:
        if len(key) != 32:
            raise VaultError("the secrets key must be 32 bytes (base64 of 32 random bytes)")
        self._key = key
        self._aead: AESGCM | None = None
        self.key_id = key_id(key)
        self._key_file = key_file

    def load(self) -> AESGCM:
        """The cipher for the current key, loaded on first use."""
        if self._aead is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._aead = AESGCM(self._key)
        return self._aead

    @classmethod
    def from_settings(cls, key_b64: str | None, key_file: Path) -> Vault:
        """The configured key, else the key file (created, 0600, on first use)."""
        if key_b64:
            return cls(base64.b64decode(key_b64))
        if not key_file.exists():
            write_key_file(key_file, new_key())
        return cls(base64.b64decode(key_file.read_text().strip()), key_file)

    def derive(self, label: str) -> bytes:
        """A 32-byte key for ``label``, from the secrets key: the same on every node of
        a cluster (they share the secrets key), and no use for opening a secret."""
        return hmac.new(self._key, b"runnerd derive\0" + label.encode(), hashlib.sha256).digest()

    def _reload(self) -> None:
        """Pick up a rotated key file (``runnerd admin rotate-secrets-key`` while serving)."""
        if self._key_file is not None and self._key_file.exists():
            key = base64.b64decode(self._key_file.read_text().strip())
            if key != self._key:
                self._key, self._aead, self.key_id = key, None, key_id(key)

    def seal(self, install_id: str, name: str, value: str) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext) for ``value``, under the current key file's key."""
        self._reload()
        nonce = secrets.token_bytes(12)
        return (
            self.key_id,
            nonce,
            self.load().encrypt(nonce, value.encode(), _aad(install_id, name)),
        )

    def open(self, install_id: str, name: str, kid: str, nonce: bytes, ciphertext: bytes) -> str:
        if kid != self.key_id:
            self._reload()
        if kid != self.key_id:
            raise VaultError(
                f"secret {name} was sealed with key {kid}, not the configured "
                f"key {self.key_id}: is secrets_key_file right?"
            )
        from cryptography.exceptions import InvalidTag

        try:
            return self.load().decrypt(nonce, ciphertext, _aad(install_id, name)).decode()
        except InvalidTag:
            raise VaultError(f"secret {name} does not decrypt with the configured key") from None


def write_key_file(path: Path, key: bytes, *, exclusive: bool = False) -> None:
    """Write a key file atomically, 0600 from its first byte. ``exclusive``: never replace
    one that exists (FileExistsError), such as one another process just made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(base64.b64encode(key).decode() + "\n")
        f.flush()
        os.fsync(f.fileno())
    if not exclusive:
        os.replace(staging, path)
        return
    try:
        os.link(staging, path)
    finally:
        staging.unlink()

"""The session cookie: a session's secret id, signed with a key kept in the data dir.

The cookie is HttpOnly, SameSite=Strict, Secure over TLS, and expires with its session.
Its value is ``<secret>.<HMAC-SHA256 of it>``: a cookie that was not made by this
daemon is refused before any lookup.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["SECURE_SESSION_COOKIE", "SESSION_COOKIE", "CookieSigner", "cookie_name"]

SESSION_COOKIE = "runnerd_session"
# Over HTTPS the cookie is a __Host- one: Secure, for this host and path / only, so no other
# host (a sibling name, a parent domain's page) can set one that takes its place.
SECURE_SESSION_COOKIE = "__Host-" + SESSION_COOKIE


def cookie_name(request: Request) -> str:
    """The session cookie's name for this request's scheme."""
    return SECURE_SESSION_COOKIE if request.url.scheme == "https" else SESSION_COOKIE


@dataclass(frozen=True)
class CookieSigner:
    key: bytes

    @classmethod
    def from_file(cls, path: Path) -> CookieSigner:
        """The key in ``path``, made (0600) on first use."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with contextlib.suppress(FileExistsError), os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(32))
        return cls(path.read_bytes())

    def _mac(self, secret: str) -> str:
        digest = hmac.new(self.key, secret.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def sign(self, secret: str) -> str:
        return f"{secret}.{self._mac(secret)}"

    def unsign(self, value: str) -> str | None:
        secret, _, mac = value.rpartition(".")
        if not secret or not hmac.compare_digest(mac, self._mac(secret)):
            return None
        return secret

    def secret_of(self, request: Request) -> str | None:
        """The session secret of the request's cookie, if this daemon signed it. A request
        carrying the cookie twice is signed out: the browser holds one set by someone else
        (a page on a sibling host or a parent domain tossing its own session in), and
        which one a server reads is the order the browser sends them in."""
        name = cookie_name(request)
        header = request.headers.get("cookie", "")
        if header.count(f"{name}=") > 1 and _session_cookies(header, name) > 1:
            return None
        value = request.cookies.get(name)
        return self.unsign(value) if value else None

    def set(self, response: Response, request: Request, secret: str, max_age_s: int) -> None:
        response.set_cookie(
            cookie_name(request),
            self.sign(secret),
            max_age=max_age_s,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def clear(self, response: Response, request: Request) -> None:
        response.delete_cookie(
            cookie_name(request),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )


def _session_cookies(header: str, name: str) -> int:
    """How many cookies of the Cookie header are named ``name``."""
    return sum(1 for part in header.split(";") if part.strip().startswith(f"{name}="))

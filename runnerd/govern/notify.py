"""A workspace's webhook: told, off the call's path, that an approval waits.

On each held call (``Notifier.approval_waiting``) a background task POSTs JSON
``{"type": "approval.waiting", ...}`` to the workspace's webhook, if it has one, signed
Stripe-like: ``Runnerd-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
"<t>.<body>")>``. A delivery that does not get a 2xx is tried again, ``webhook_retry_s``
later, then twice as long each time, ``WEBHOOK_TRIES`` tries in all, each with the webhook
as it is then (removed: no more tries). The body never holds the call's input; the log
names the delivery and the URL's origin, never its path (a webhook's path often carries a
token) or the secret.

Private addresses are allowed (a webhook to an internal service is the usual need of a
self-hosted install): only the admins of a workspace set its URL. Never this daemon
itself: a URL that reaches it is refused when set, and again when delivered (redirects are
not followed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import msgspec

from runnerd import __version__
from runnerd.config import Settings
from runnerd.errors import InvalidWebhookUrl
from runnerd.ids import new_id
from runnerd.limits import (
    MAX_WEBHOOK_URL_CHARS,
    WEBHOOK_MAX_PENDING,
    WEBHOOK_TIMEOUT_S,
    WEBHOOK_TRIES,
)
from runnerd.store import ApprovalRow, Store
from runnerd.store.approval_rules import webhook_sealed_name
from runnerd.vault import Vault

__all__ = ["Notifier", "new_webhook_secret", "sign", "webhook_url"]

log = logging.getLogger("runnerd")

SIGNATURE_HEADER = "Runnerd-Signature"


def new_webhook_secret() -> str:
    """A new signing secret (shown to the admin once; the key of the HMAC is its UTF-8)."""
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Runnerd-Signature`` header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _is_local(address: str) -> bool:
    """Whether ``address`` is one of this machine's (loopback, or one it can bind)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def _reaches_daemon(url: str, settings: Settings, addresses: list[str]) -> bool:
    """Whether ``url`` (resolved to ``addresses``) is this daemon: its public address, or
    a local address on the port it listens on."""
    if _origin(url) == _origin(settings.public_base):
        return True
    return _port(url) == settings.port and any(_is_local(a) for a in addresses)


async def _addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to (itself for an IP literal; none when unknown)."""
    with contextlib.suppress(ValueError):
        return [str(ipaddress.ip_address(host.strip("[]")))]
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, None)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in found})


async def webhook_url(url: str, settings: Settings) -> str:
    """``url`` checked as a webhook's: http(s) with a host, at most MAX_WEBHOOK_URL_CHARS,
    no user info, never this daemon itself (InvalidWebhookUrl otherwise)."""
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise InvalidWebhookUrl(f"a webhook URL is at most {MAX_WEBHOOK_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise InvalidWebhookUrl("the webhook URL does not parse") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidWebhookUrl("a webhook URL is http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhookUrl("a webhook URL carries no user or password")
    if _reaches_daemon(url, settings, await _addresses(parts.hostname)):
        raise InvalidWebhookUrl("a webhook URL may not reach this runnerd itself")
    return url


@dataclass
class Notifier:
    """Deliveries of ``approval.waiting`` to workspaces' webhooks, in tasks of their own."""

    store: Store
    vault: Vault
    settings: Settings
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _client: Any = None  # httpx.AsyncClient, made on the first delivery

    def approval_waiting(self, approval: ApprovalRow, app_slug: str) -> None:
        """Tell the approval's workspace's webhook, if it has one, that ``approval``
        waits. Returns at once: the delivery and its retries run in a task of their own,
        and their failures are logged, never raised."""
        if len(self._tasks) >= WEBHOOK_MAX_PENDING:
            log.warning(
                "webhook: %d deliveries waiting; %s not sent", len(self._tasks), approval.id
            )
            return
        task = asyncio.ensure_future(self._deliver(approval, app_slug))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _body(self, approval: ApprovalRow, app_slug: str, asked_by: str) -> bytes:
        """What a delivery says: the approval, never the call's input."""
        return msgspec.json.encode(
            {
                "type": "approval.waiting",
                "approvalId": approval.id,
                "workspaceId": approval.workspace_id,
                "app": app_slug,
                "installId": approval.install_id,
                "tool": approval.tool,
                "surface": approval.surface,
                "askedBy": asked_by,
                "askedAt": approval.created_at,
                "expiresAt": approval.expires_at,
                "url": f"{self.settings.public_base}/#/approvals",
            }
        )

    async def _deliver(self, approval: ApprovalRow, app_slug: str) -> None:
        """Each try reads the webhook afresh: one removed meanwhile gets no more tries,
        one changed gets them at its new URL, with its new secret."""
        delivery = new_id("whd")
        body: bytes | None = None
        for attempt in range(1, WEBHOOK_TRIES + 1):
            try:
                found = await self._hook(approval.workspace_id)
                if found is None:
                    return
                url, secret = found
                if body is None:
                    asker = await self.store.io(self.store.get_user, approval.requested_by)
                    email = asker.email if asker else approval.requested_by
                    body = self._body(approval, app_slug, email)
            except Exception as exc:  # a task nobody awaits: say it, never raise it
                log.error("webhook %s of %s not sent: %s", delivery, approval.workspace_id,
                          type(exc).__name__)  # fmt: skip
                return
            outcome = await self._attempt(url, secret, body, delivery)
            if outcome is None:
                return
            if attempt == WEBHOOK_TRIES:
                log.error(
                    "webhook %s to %s failed %d times (last: %s); not sent",
                    delivery, _origin(url), attempt, outcome,
                )  # fmt: skip
                return
            delay = self.settings.webhook_retry_s * 2 ** (attempt - 1)
            log.warning(
                "webhook %s to %s: %s (try %d of %d; again in %g s)",
                delivery, _origin(url), outcome, attempt, WEBHOOK_TRIES, delay,
            )  # fmt: skip
            await asyncio.sleep(delay)

    async def _hook(self, workspace_id: str) -> tuple[str, str] | None:
        """The workspace's webhook now, (URL, opened secret), or None when it has none."""
        hook = await self.store.io(self.store.webhook, workspace_id)
        if hook is None:
            return None
        secret = self.vault.open(
            workspace_id,
            webhook_sealed_name(workspace_id),
            hook.secret_kid,
            hook.secret_nonce,
            hook.secret_sealed,
        )
        return hook.url, secret

    async def _attempt(self, url: str, secret: str, body: bytes, delivery: str) -> str | None:
        """One POST; None when it was taken (a 2xx), else what went wrong (no message of
        the receiver's: a status or an exception's type)."""
        import httpx

        host = urlsplit(url).hostname or ""
        if _reaches_daemon(url, self.settings, await _addresses(host)):
            return "refused: it reaches this runnerd itself"
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False)
        stamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"runnerd/{__version__}",
            "Runnerd-Event": "approval.waiting",
            "Runnerd-Delivery": delivery,
            SIGNATURE_HEADER: sign(secret, stamp, body),
        }
        try:
            answer = await self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"

    async def close(self) -> None:
        """Cancel deliveries still waiting (at shutdown) and close the client."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1)
        if self._client is not None:
            await self._client.aclose()

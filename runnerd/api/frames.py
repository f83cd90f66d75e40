"""Frame tokens: what opens an install's pages on the apps origin, and proves a bridge
call came from that frame (issue 26).

``POST /api/v2/apps/installs/{installId}/frame`` (a person's session or personal key; a
member with Apps access to the install) answers the frame's URL on the apps origin,
``<apps_url>/f/<token>/<entry>``. The token is ``<payload>.<mac>`` in base64url (safe in
a URL path): the payload binds the install, the person and the expiry (an hour), the MAC
is HMAC-SHA256 under a key derived from the secrets key (``vault.derive("app frames")``),
so every node of a cluster accepts a token any node made, and a restart keeps them.

``verify_frame_token(token)`` -> (install id, user id), or None for a token that is
malformed, forged, or expired: the apps origin (daemon/apps_origin.py) serves with it, and
the bridge's calls (api/surfaces.py: ``X-Runnerd-Frame``) prove surface ``app`` with it.
It checks against the keys of the daemons serving in this process (``use_key``, from the
lifespan): one, in a daemon.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from datetime import UTC, datetime
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of, install_of
from runnerd.api.bodies import FrameInfo
from runnerd.api.ops import INSTALL_ID, Op, json_response
from runnerd.api.state import AppState
from runnerd.errors import NoPages, PagesOff, PersonalKeyRequired
from runnerd.ids import stamp
from runnerd.limits import FRAME_TOKEN_TTL_S, MAX_FRAME_TOKEN_CHARS
from runnerd.store import InstallRecord

__all__ = [
    "FRAME_KEY_LABEL",
    "OPS",
    "drop_key",
    "frame_caller",
    "issue_frame_token",
    "use_key",
    "verify_frame_token",
]

FRAME_KEY_LABEL = "app frames"  # vault.derive's label: the key frame tokens are signed with
_MAC_PREFIX = b"runnerd frame token v1\0"

# The frame keys of the daemons serving in this process (a daemon: one; tests may serve
# several apps at once). Set by the lifespan (use_key), dropped when it ends.
_keys: list[bytes] = []


def use_key(key: bytes) -> None:
    """Accept tokens signed with ``key`` (a serving daemon's frame key)."""
    _keys.append(key)


def drop_key(key: bytes) -> None:
    """Stop accepting ``key``'s tokens (the daemon stopped)."""
    if key in _keys:
        _keys.remove(key)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, _MAC_PREFIX + payload.encode(), hashlib.sha256).digest()


def issue_frame_token(
    key: bytes, install_id: str, user_id: str, *, now: float | None = None
) -> tuple[str, float]:
    """A token for ``user_id``'s frame of ``install_id``, and when it expires (epoch s)."""
    expires = int((time.time() if now is None else now) + FRAME_TOKEN_TTL_S)
    nonce = secrets.token_hex(8)  # two frames opened in one second get two tokens
    payload = _b64(f"{install_id}\0{user_id}\0{expires}\0{nonce}".encode())
    return f"{payload}.{_b64(_mac(key, payload))}", float(expires)


def verify_frame_token(token: str, *, now: float | None = None) -> tuple[str, str] | None:
    """(install id, user id) of a frame token a serving daemon of this process signed
    and that has not expired; None for any other string. Says nothing of whether the
    person may still use the install: the caller checks that, as for any call."""
    if not token or len(token) > MAX_FRAME_TOKEN_CHARS or token.count(".") != 1:
        return None
    payload, _, mac = token.partition(".")
    try:
        sent = _unb64(mac)
        fields = _unb64(payload).decode().split("\0")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not any(hmac.compare_digest(sent, _mac(key, payload)) for key in list(_keys)):
        return None
    if len(fields) != 4 or not fields[2].isdigit():
        return None
    install_id, user_id, expires, _ = fields
    if int(expires) <= (time.time() if now is None else now):
        return None
    return install_id, user_id


async def frame_caller(
    request: Request, state: AppState, what: str
) -> tuple[InstallRecord, str, str, str]:
    """The install of the path, the caller's user id, key id (a session's id) and the
    apps origin, for a person who may run the install's tools (a member or above, with
    Apps access): who may open its frame, or serve dev pages in it (``what`` names
    which, in the refusal of a token). 409 PAGES_OFF when the daemon serves no pages."""
    caller = await caller_of(request, state, "api:read")
    if caller.key.kind == "token":
        raise PersonalKeyRequired(
            f"{what} for a person: with the Manage page's session or a personal API key, "
            "not a token"
        )
    user_id = caller.need_person()
    install = await install_of(request, state, caller, "member")  # may_run, in effect
    base = state.settings.apps_base
    if base is None:
        raise PagesOff
    return install, user_id, caller.key.id, base


async def open_frame(request: Request, state: AppState) -> Response:
    """A frame of the install's pages for the caller, audited as ``app.open``."""
    install, user_id, key_id, base = await frame_caller(request, state, "An app's frame opens")
    store = state.store
    entry = await store.io(store.page_entry, install.version_id)
    if entry is None:
        raise NoPages
    token, expires = issue_frame_token(state.frame_key, install.id, user_id)
    expires_at = stamp(datetime.fromtimestamp(expires, UTC))
    await store.io(
        store.audit,
        "app.open",
        workspace_id=install.workspace_id,
        install_id=install.id,
        version_id=install.version_id,
        actor_user_id=user_id,
        actor_key_id=key_id,
        detail={"expiresAt": expires_at},
    )
    return json_response(
        FrameInfo(
            url=f"{base}/f/{token}/{quote(entry)}", origin=base, token=token, expires_at=expires_at
        ),
        status=201,
    )


OPS = [
    Op(
        "POST",
        "/api/v2/apps/installs/{installId}/frame",
        "openAppFrame",
        "Open the install's pages in a frame: a URL on the apps origin",
        open_frame,
        FrameInfo,
        status=201,
        params=(INSTALL_ID,),
        errors=(401, 403, 404, 409, 429, 500),
        description="For a person (the Manage page's session or a personal key; a member "
        "with Apps access to the install). The answer's url opens the current version's "
        "entry page on the apps origin (a switch or rollback changes what it serves at "
        "once); its token, good for an hour, is the X-Runnerd-Frame header of the "
        "bridge's calls, which records their runs as surface app. Audited as app.open. "
        "404 NO_PAGES when the version has no pages, 409 PAGES_OFF when the daemon "
        "serves none (apps_port 0).",
    ),
]

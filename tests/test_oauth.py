"""OAuth 2.1 for MCP clients: runnerd as the authorization server of its people.

Raw HTTP against the app in this process (metadata, PKCE, codes, refresh rotation,
access that dies with membership, consent denied, Client ID Metadata Documents from a
loopback server), on both stores. The official SDK's ``OAuthClientProvider`` end to end,
the consent screen driven in Chromium: tests/test_oauth_sdk.py.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from conftest import write_app
from daemon import Runnerd, envelope
from runnerd.store import DB_FILENAME, hash_key
from test_governance import audit

# The store's OAuth SQL runs on both stores; the browser flows once (test_oauth_sdk.py).
BACKENDS = ("sqlite", "postgresql")
DAEMON_SETTINGS = {"oauth_allow_loopback_clients": "true", "rate_limit_burst": "1000"}

CALLBACK = "http://127.0.0.1:9/callback"  # never reached: the tests read the redirect


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode().rstrip("=")


def register(d: Runnerd, redirect: str = CALLBACK, **extra: Any) -> dict[str, Any]:
    body = {
        "redirect_uris": [redirect],
        "client_name": "Test chat client",
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        **extra,
    }
    response = d.fresh("POST", "/oauth/register", json=body)
    assert response.status_code == 201, response.text
    found: dict[str, Any] = response.json()
    return found


def authorize(
    d: Runnerd, client_id: str, challenge: str, redirect: str = CALLBACK, **extra: str
) -> httpx.Response:
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "st-1",
        "scope": "api:read tools:run",
        **extra,
    }
    return d.fresh("GET", "/oauth/authorize", params=params)


def request_id(response: httpx.Response) -> str:
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    fragment = urlsplit(location).fragment
    assert fragment.startswith("/consent?"), location
    return parse_qs(fragment.split("?", 1)[1])["request"][0]


def decide(
    d: Runnerd, rid: str, key: str, *, allow: bool = True, workspace: str | None = None,
    scopes: list[str] | None = None,
) -> httpx.Response:  # fmt: skip
    body: dict[str, Any] = {"allow": allow}
    if allow:
        body["workspaceId"] = workspace or d.workspace_id
    if scopes is not None:
        body["scopes"] = scopes
    return d.call("POST", f"/api/v2/oauth/requests/{rid}/decision", key, json=body)


def code_of(redirect_to: str) -> str:
    query = parse_qs(urlsplit(redirect_to).query)
    assert query["state"] == ["st-1"], query
    return query["code"][0]


def token(d: Runnerd, **form: str) -> httpx.Response:
    return d.fresh("POST", "/oauth/token", data=form)


def grant(
    d: Runnerd, key: str, client: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A client registered, consented to by ``key``'s person, and its tokens."""
    client = client or register(d)
    verifier, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    decided = decide(d, rid, key)
    assert decided.status_code == 200, decided.text
    response = token(
        d,
        grant_type="authorization_code",
        code=code_of(decided.json()["redirectTo"]),
        redirect_uri=CALLBACK,
        client_id=client["client_id"],
        code_verifier=verifier,
    )
    assert response.status_code == 200, response.text
    return client, response.json()


def apps_of(d: Runnerd, access: str) -> httpx.Response:
    return d.fresh(
        "GET",
        "/api/v2/apps",
        params={"workspaceId": d.workspace_id},
        headers={"Authorization": f"Bearer {access}"},
    )


# --- metadata -------------------------------------------------------------------------------


def test_metadata_documents(app_daemon: Runnerd) -> None:
    d = app_daemon
    for path in (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ):
        resource = d.fresh("GET", path)
        assert resource.status_code == 200, resource.text
        body = resource.json()
        issuer = body["authorization_servers"][0]
        assert body["resource"] == f"{issuer}/mcp"
        assert body["scopes_supported"] == ["api:read", "tools:run"]
    server = d.fresh("GET", "/.well-known/oauth-authorization-server").json()
    assert server["issuer"] == issuer
    assert server["authorization_endpoint"] == f"{issuer}/oauth/authorize"
    assert server["token_endpoint"] == f"{issuer}/oauth/token"
    assert server["revocation_endpoint"] == f"{issuer}/oauth/revoke"
    assert server["registration_endpoint"] == f"{issuer}/oauth/register"
    assert server["code_challenge_methods_supported"] == ["S256"]
    assert server["response_types_supported"] == ["code"]
    assert server["scopes_supported"] == ["api:read", "tools:run"]
    assert server["client_id_metadata_document_supported"] is True
    # Another Host is refused, as on /mcp (DNS rebinding).
    other = d.fresh(
        "GET", "/.well-known/oauth-authorization-server", headers={"Host": "evil.example"}
    )
    assert other.status_code == 403


def test_a_401_from_mcp_names_the_resource_metadata(app_daemon: Runnerd) -> None:
    d = app_daemon
    response = d.fresh(
        "POST",
        "/mcp",
        params={"workspaceId": d.workspace_id},
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHORIZED"  # the envelope, as before
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer resource_metadata=")
    url = challenge.split('resource_metadata="', 1)[1].split('"', 1)[0]
    assert url.endswith("/.well-known/oauth-protected-resource/mcp")


# --- the code flow ----------------------------------------------------------------------------


def test_a_code_for_tokens_that_act_in_the_consented_workspace(app_daemon: Runnerd) -> None:
    d = app_daemon
    _, tokens = grant(d, d.admin_key)
    assert tokens["token_type"].lower() == "bearer"
    assert tokens["expires_in"] == 3600
    assert tokens["scope"] == "api:read tools:run"
    assert apps_of(d, tokens["access_token"]).status_code == 200
    # Bound to that workspace: another one of the same person is not reached.
    store = d.store()
    try:
        other = store.create_workspace("Elsewhere")
        user = store.find_user("ada@example.com")
        assert user is not None
        store.set_membership(other.id, user.id, role="admin", apps_access=True)
    finally:
        store.close()
    elsewhere = d.fresh(
        "GET",
        "/api/v2/apps",
        params={"workspaceId": other.id},
        headers={"Authorization": f"Bearer {tokens['access_token']}"},
    )
    assert elsewhere.status_code == 403
    # Only hashes are stored (the SQLite file and its write-ahead log, when on SQLite).
    files = [f for f in d.data_dir.glob(f"{DB_FILENAME}*") if f.is_file()]
    assert files or "RUNNERD_DATABASE_URL" in d.env
    raw = b"".join(f.read_bytes() for f in files)
    assert hash_key(tokens["access_token"]).encode() in raw or not files  # the check can see
    for plaintext in (tokens["access_token"], tokens["refresh_token"]):
        assert plaintext.encode() not in raw
    actions = [e["action"] for e in audit(d)]
    assert "oauth.consent.grant" in actions and "oauth.token.issue" in actions
    granted = next(e for e in audit(d) if e["action"] == "oauth.consent.grant")
    assert granted["actorUserId"] == user.id


def test_a_wrong_verifier_is_an_invalid_grant(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    _, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
    wrong, _ = pkce()
    response = token(
        d, grant_type="authorization_code", code=code, redirect_uri=CALLBACK,
        client_id=client["client_id"], code_verifier=wrong,
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"


def test_plain_pkce_and_no_pkce_are_refused(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    verifier, _ = pkce()
    plain = authorize(d, client["client_id"], verifier, code_challenge_method="plain")
    assert plain.status_code == 302
    assert parse_qs(urlsplit(plain.headers["location"]).query)["error"] == ["invalid_request"]
    params = {"response_type": "token", "client_id": client["client_id"], "redirect_uri": CALLBACK,
              "code_challenge": verifier}  # fmt: skip
    implicit = d.fresh("GET", "/oauth/authorize", params=params)
    assert parse_qs(urlsplit(implicit.headers["location"]).query)["error"] == [
        "unsupported_response_type"
    ]


def test_a_code_works_once_and_its_reuse_revokes_its_tokens(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    verifier, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK,
            "client_id": client["client_id"], "code_verifier": verifier}  # fmt: skip
    first = token(d, **form)
    assert first.status_code == 200, first.text
    again = token(d, **form)
    assert again.status_code == 400
    assert again.json()["error"] == "invalid_grant"
    assert apps_of(d, first.json()["access_token"]).status_code == 401  # revoked with it
    # The consent request was spent as well.
    assert decide(d, rid, d.admin_key).status_code == 404


def test_a_redirect_uri_must_match_exactly(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    verifier, challenge = pkce()
    elsewhere = authorize(d, client["client_id"], challenge, redirect=CALLBACK + "/../evil")
    assert elsewhere.status_code == 400  # shown, never redirected to
    assert "location" not in elsewhere.headers
    assert elsewhere.json()["error"] == "invalid_request"
    rid = request_id(authorize(d, client["client_id"], challenge))
    code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
    response = token(
        d, grant_type="authorization_code", code=code, redirect_uri="http://127.0.0.1:9/other",
        client_id=client["client_id"], code_verifier=verifier,
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


def test_an_expired_code_is_refused(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    verifier, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
    store = d.store()
    try:  # sixty seconds later
        past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
        store.db.execute(
            "UPDATE oauth_codes SET expires_at = ? WHERE code_hash = ?", [past, hash_key(code)]
        )
    finally:
        store.close()
    response = token(
        d, grant_type="authorization_code", code=code, redirect_uri=CALLBACK,
        client_id=client["client_id"], code_verifier=verifier,
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"
    assert "expired" in response.json()["error_description"]


def test_refresh_rotates_and_a_replayed_refresh_ends_the_grant(app_daemon: Runnerd) -> None:
    d = app_daemon
    client, tokens = grant(d, d.admin_key)
    cid = client["client_id"]
    first = token(
        d, grant_type="refresh_token", refresh_token=tokens["refresh_token"], client_id=cid
    )
    assert first.status_code == 200, first.text
    rotated = first.json()
    assert rotated["refresh_token"] != tokens["refresh_token"]
    assert rotated["access_token"] != tokens["access_token"]
    assert apps_of(d, rotated["access_token"]).status_code == 200
    old = token(d, grant_type="refresh_token", refresh_token=tokens["refresh_token"], client_id=cid)
    assert old.status_code == 400
    assert old.json()["error"] == "invalid_grant"
    # The replay revoked the whole family: the rotated pair is dead too.
    assert apps_of(d, rotated["access_token"]).status_code == 401
    newer = token(
        d, grant_type="refresh_token", refresh_token=rotated["refresh_token"], client_id=cid
    )
    assert newer.status_code == 400
    assert "oauth.token.refresh" in [e["action"] for e in audit(d)]


def test_leaving_the_workspace_ends_access_and_refresh(app_daemon: Runnerd) -> None:
    d = app_daemon
    key = d.person("leaver@example.com", role="member")
    client, tokens = grant(d, key)
    assert apps_of(d, tokens["access_token"]).status_code == 200
    store = d.store()
    try:
        user = store.find_user("leaver@example.com")
        assert user is not None
        store.remove_member(d.workspace_id, user.id)
    finally:
        store.close()
    assert apps_of(d, tokens["access_token"]).status_code == 403
    refreshed = token(
        d, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
        client_id=client["client_id"],
    )  # fmt: skip
    assert refreshed.status_code == 400
    assert refreshed.json()["error"] == "invalid_grant"


def test_revoking_a_token_ends_the_grant(app_daemon: Runnerd) -> None:
    d = app_daemon
    client, tokens = grant(d, d.admin_key)
    revoked = d.fresh(
        "POST",
        "/oauth/revoke",
        data={"token": tokens["access_token"], "client_id": client["client_id"]},
    )
    assert revoked.status_code == 200, revoked.text
    assert apps_of(d, tokens["access_token"]).status_code == 401
    refreshed = token(
        d, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
        client_id=client["client_id"],
    )  # fmt: skip
    assert refreshed.status_code == 400
    entry = next(e for e in reversed(audit(d)) if e["action"] == "oauth.token.revoke")
    assert entry["detail"]["reason"] == "revoked"


def test_revoking_the_key_on_the_people_page_ends_refresh_too(app_daemon: Runnerd) -> None:
    d = app_daemon
    client, tokens = grant(d, d.admin_key)
    keys = d.call("GET", f"/api/v2/workspaces/{d.workspace_id}/keys", d.admin_key).json()["data"]
    mine = next(k for k in keys if k["prefix"] == tokens["access_token"][:10])
    assert mine["name"] == "OAuth: Test chat client"
    gone = d.call(
        "DELETE", f"/api/v2/workspaces/{d.workspace_id}/keys/{mine['keyId']}", d.admin_key
    )
    assert gone.status_code in (200, 204), gone.text
    refreshed = token(
        d, grant_type="refresh_token", refresh_token=tokens["refresh_token"],
        client_id=client["client_id"],
    )  # fmt: skip
    assert refreshed.status_code == 400


def test_an_expired_access_token_is_refused(app_daemon: Runnerd) -> None:
    d = app_daemon
    _, tokens = grant(d, d.admin_key)
    store = d.store()
    try:
        store.db.execute(
            "UPDATE api_keys SET expires_at = ? WHERE key_hash = ?",
            ["2000-01-01T00:00:00.000Z", hash_key(tokens["access_token"])],
        )
    finally:
        store.close()
    assert apps_of(d, tokens["access_token"]).status_code == 401


def test_deny_sends_access_denied(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    _, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    shown = d.call("GET", f"/api/v2/oauth/requests/{rid}", d.admin_key)
    assert shown.status_code == 200, shown.text
    assert shown.json()["clientName"] == "Test chat client"
    assert shown.json()["redirectHost"] == "127.0.0.1:9"
    denied = decide(d, rid, d.admin_key, allow=False)
    assert denied.status_code == 200, denied.text
    query = parse_qs(urlsplit(denied.json()["redirectTo"]).query)
    assert query["error"] == ["access_denied"]
    assert query["state"] == ["st-1"]
    assert "code" not in query
    assert "oauth.consent.deny" in [e["action"] for e in audit(d)]


def test_only_a_person_consents_and_only_to_what_was_asked(app_daemon: Runnerd) -> None:
    d = app_daemon
    client, tokens = grant(d, d.admin_key)
    _, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge, scope="tools:run"))
    by_token = d.fresh(
        "POST",
        f"/api/v2/oauth/requests/{rid}/decision",
        json={"allow": True, "workspaceId": d.workspace_id},
        headers={"Authorization": f"Bearer {tokens['access_token']}"},
    )
    assert by_token.status_code == 403
    more = decide(d, rid, d.admin_key, scopes=["tools:run", "api:read"])
    assert more.status_code == 400
    outsider = d.person("outsider@example.com", workspace_id=d.store().create_workspace("X").id)
    assert decide(d, rid, outsider).status_code == 403  # not a member of the workspace
    narrowed = decide(d, rid, d.admin_key, scopes=["tools:run"])
    assert narrowed.status_code == 200, narrowed.text


# --- Client ID Metadata Documents -----------------------------------------------------------


@contextlib.contextmanager
def document_server(document: dict[str, Any] | None = None) -> Iterator[tuple[str, list[str]]]:
    """A loopback server of one client metadata document at /client.json (its URL is
    its client_id); yields the URL and the paths asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps(served).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}/client.json"
    served = document or {
        "client_id": url,
        "client_name": "Documented client",
        "redirect_uris": [CALLBACK],
        "grant_types": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_method": "none",
    }
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield url, asked
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_known_by_its_metadata_document(app_daemon: Runnerd) -> None:
    d = app_daemon
    with document_server() as (url, asked):
        verifier, challenge = pkce()
        rid = request_id(authorize(d, url, challenge))
        assert asked == ["/client.json"]
        shown = d.call("GET", f"/api/v2/oauth/requests/{rid}", d.admin_key).json()
        assert shown["clientName"] == "Documented client"
        assert shown["clientId"] == url
        code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
        response = token(
            d, grant_type="authorization_code", code=code, redirect_uri=CALLBACK,
            client_id=url, code_verifier=verifier,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert len(asked) == 1  # cached
        # A redirect URI the document does not list is refused.
        other = authorize(d, url, challenge, redirect="http://127.0.0.1:9/elsewhere")
        assert other.status_code == 400


def test_a_document_that_names_another_client_is_refused(app_daemon: Runnerd) -> None:
    d = app_daemon
    wrong = {"client_id": "https://elsewhere.example/client.json", "redirect_uris": [CALLBACK]}
    with document_server(wrong) as (url, asked):
        _, challenge = pkce()
        response = authorize(d, url, challenge)
        assert asked == ["/client.json"]
        assert response.status_code == 400
        assert response.json()["error"] == "invalid_request"


def test_a_document_is_fetched_only_from_public_addresses() -> None:
    """Without oauth_allow_loopback_clients, a loopback (or any private) address and
    plain http are refused before any request is sent."""
    import asyncio

    from runnerd.oauth.documents import DocumentRefused, fetch_document

    with document_server() as (url, asked):
        with pytest.raises(DocumentRefused, match="must be https"):
            asyncio.run(fetch_document(url, allow_loopback=False))
        https = url.replace("http://", "https://")
        with pytest.raises(DocumentRefused, match="not a public address"):
            asyncio.run(fetch_document(https, allow_loopback=False))
        private = "https://10.1.2.3/client.json"
        with pytest.raises(DocumentRefused, match="not a public address"):
            asyncio.run(fetch_document(private, allow_loopback=True))
        assert asked == []
        found = asyncio.run(fetch_document(url, allow_loopback=True))
        assert found["client_name"] == "Documented client"


def test_a_client_with_a_secret_must_send_it(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d, token_endpoint_auth_method="client_secret_post")
    secret = client["client_secret"]
    store = d.store()
    try:
        row = store.oauth_client(client["client_id"])
    finally:
        store.close()
    assert row is not None and secret not in json.dumps(row)  # a hash only
    verifier, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK,
            "client_id": client["client_id"], "code_verifier": verifier}  # fmt: skip
    for wrong in ({}, {"client_secret": "not-it"}):
        refused = token(d, **form, **wrong)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"] == "invalid_client"
    basic = base64.b64encode(f"{client['client_id']}:{secret}".encode()).decode()
    answered = d.fresh(
        "POST", "/oauth/token", data=form, headers={"Authorization": f"Basic {basic}"}
    )
    assert answered.status_code == 200, answered.text


def test_a_token_without_tools_run_is_told_to_ask_for_it(app_daemon: Runnerd) -> None:
    d = app_daemon
    client = register(d)
    verifier, challenge = pkce()
    rid = request_id(authorize(d, client["client_id"], challenge))
    decided = decide(d, rid, d.admin_key, scopes=["api:read"])
    form = {
        "grant_type": "authorization_code",
        "code": code_of(decided.json()["redirectTo"]),
        "redirect_uri": CALLBACK,
        "client_id": client["client_id"],
        "code_verifier": verifier,
    }
    tokens = token(d, **form).json()
    assert tokens["scope"] == "api:read"
    assert apps_of(d, tokens["access_token"]).status_code == 200
    response = d.fresh(
        "POST",
        "/mcp",
        params={"workspaceId": d.workspace_id},
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {tokens['access_token']}",
        },
    )
    assert response.status_code == 403
    assert response.json()["error"]["details"]["code"] == "INSUFFICIENT_SCOPE"
    assert 'error="insufficient_scope"' in response.headers["www-authenticate"]


def test_an_oauth_token_s_calls_are_chat_calls(app_daemon: Runnerd, tmp_path: Path) -> None:
    """The person consented to a chat client whose write tools wait for them: its token
    calling the API is held, as a chat call; naming api (no claim) is too, and naming
    another surface is refused (SURFACE_NOT_PROVEN): never run at once."""
    app = write_app(tmp_path / "pay", "oauth-pay", {"send": "def run(i):\n    return {}\n"},
                    docs={"send": {"effect": "write"}})  # fmt: skip
    install = app_daemon.ship(app)["installId"]
    _, tokens = grant(app_daemon, app_daemon.admin_key)
    for surface in ("api", "chat", "app", "workflow", "test"):
        held = app_daemon.fresh(
            "POST", f"/api/v2/apps/installs/{install}/tools/send/run",
            json={"input": {}, "surface": surface},
            headers={"Authorization": f"Bearer {tokens['access_token']}"},
        )  # fmt: skip
        if surface not in ("api", "chat"):
            envelope(held, 403, "SURFACE_NOT_PROVEN")
            continue
        assert held.status_code == 202, held.text
        approval = held.json()["approvalId"]
        found = app_daemon.call("GET", f"/api/v2/approvals/{approval}", app_daemon.admin_key)
        assert found.json()["surface"] == "chat", found.text


# --- what outside testing found -------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    ["64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "2002:7f00:1::", "2002:a9fe:a9fe::",
     "::ffff:169.254.169.254", "169.254.169.254", "10.0.0.1", "fc00::1"],
)  # fmt: skip
def test_a_document_host_that_carries_a_private_ipv4_is_refused(address: str) -> None:
    """NAT64, 6to4 and mapped forms are judged by the address they stand for."""
    from runnerd.oauth.documents import _allowed

    assert not _allowed(address, loopback=False) and not _allowed(address, loopback=True)


def test_a_code_or_refresh_for_another_resource_is_refused(app_daemon: Runnerd) -> None:
    d = app_daemon
    ours = d.fresh("GET", "/.well-known/oauth-protected-resource").json()["resource"]
    client = register(d)
    verifier, challenge = pkce()
    fragment = authorize(d, client["client_id"], challenge, resource=f"{ours}#x")
    assert parse_qs(urlsplit(fragment.headers["location"]).query)["error"] == ["invalid_target"]
    rid = request_id(authorize(d, client["client_id"], challenge))
    code = code_of(decide(d, rid, d.admin_key).json()["redirectTo"])
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK,
            "client_id": client["client_id"], "code_verifier": verifier}  # fmt: skip
    elsewhere = token(d, **form, resource="http://evil.example/x")
    assert elsewhere.status_code == 400 and elsewhere.json()["error"] == "invalid_target"
    issued = token(d, **form, resource=ours)
    assert issued.status_code == 200, issued.text
    refresh = {"grant_type": "refresh_token", "client_id": client["client_id"],
               "refresh_token": issued.json()["refresh_token"]}  # fmt: skip
    refused = token(d, **refresh, resource="http://evil.example/")
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_target"


def test_registrations_and_requests_are_bounded(app_daemon: Runnerd) -> None:
    """Anyone may register or ask: what they may make the daemon keep is small."""
    d = app_daemon
    body = {"client_name": "big", "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code"]}  # fmt: skip
    for extra, status in (
        ({"redirect_uris": [CALLBACK], "client_uri": "https://x.example/" + "a" * 100_000}, 413),
        ({"redirect_uris": [CALLBACK], "client_uri": "https://x.example/" + "a" * 3000}, 400),
        ({"redirect_uris": [f"{CALLBACK}{n}" for n in range(11)]}, 400),
        ({"redirect_uris": [CALLBACK], "client_name": "n" * 201}, 400),
        ({"redirect_uris": ["http://a@127.0.0.1:9/cb"]}, 400),
        ({"redirect_uris": ["https://app.example/cb#f"]}, 400),
    ):
        made = d.fresh("POST", "/oauth/register", json={**body, **extra})
        assert made.status_code == status, (extra.keys(), made.text[:200])
    assert register(d, "http://127.5.5.5:9/cb")["redirect_uris"] == ["http://127.5.5.5:9/cb"]
    client = register(d)
    _, challenge = pkce()
    long_state = authorize(d, client["client_id"], challenge, state="s" * 1025)
    assert parse_qs(urlsplit(long_state.headers["location"]).query)["error"] == ["invalid_request"]
    huge = authorize(d, client["client_id"], challenge, junk="j" * 5000)
    assert huge.status_code == 400 and "QUERY_TOO_LARGE" in huge.text

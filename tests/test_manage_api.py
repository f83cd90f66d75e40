"""The API behind the Manage page, through the daemon's app in this process
(tests/inproc.py): sessions (a personal key or a one-time link, a signed cookie, CSRF on
every change), people and keys, a tool's detail and the input check, the security
headers. What runs tools (a session's run, the audit verdict, the ledger as CSV, usage
per day) is in test_manage_api_daemon.py, on a real daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from daemon import Runnerd, envelope
from inproc import InProcess

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deal-desk"
GOOD = {
    "discountPct": 12,
    "marginPct": 30,
    "termMonths": 24,
    "dealSize": 120000,
    "tier": "enterprise",
}

# The tests on the module's app run on both stores.
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="module")
def install(app_daemon: InProcess) -> str:
    return str(app_daemon.ship(EXAMPLE)["installId"])


@pytest.fixture
def browser_like(app_daemon: InProcess) -> Iterator[httpx.Client]:
    """A client that keeps cookies, as a browser does."""
    with app_daemon.client() as client:
        yield client


def _sign_in(client: httpx.Client, **body: str) -> dict[str, object]:
    response = client.post("/api/v2/session", json=body)
    assert response.status_code == 200, response.text
    found: dict[str, object] = response.json()
    return found


@pytest.mark.smoke
def test_a_personal_key_signs_in_with_a_signed_strict_http_only_cookie(
    app_daemon: InProcess, browser_like: httpx.Client
) -> None:
    response = browser_like.post("/api/v2/session", json={"apiKey": app_daemon.admin_key})
    assert response.status_code == 200, response.text
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("runnerd_session=")
    for flag in ("HttpOnly", "SameSite=strict", "Max-Age=43200", "Path=/"):
        assert flag.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower()  # plain HTTP on loopback; Secure over TLS
    info = response.json()
    assert info["email"] == "ada@example.com" and info["csrfToken"]
    assert info["workspaces"][0]["role"] == "admin"
    assert browser_like.get("/api/v2/session").json()["email"] == "ada@example.com"

    # The cookie's value is signed: a changed one is no session at all.
    value = browser_like.cookies["runnerd_session"]
    forged = app_daemon.client(cookies={"runnerd_session": value[:-2] + "xx"})
    envelope(forged.get("/api/v2/session"), 401)

    # Sign-out needs the CSRF token too, then the session is gone.
    envelope(browser_like.delete("/api/v2/session"), 403, "CSRF_TOKEN_INVALID")
    signed_out = browser_like.delete(
        "/api/v2/session", headers={"X-CSRF-Token": str(info["csrfToken"])}
    )
    assert signed_out.status_code == 200
    stale = app_daemon.client(cookies={"runnerd_session": value})
    envelope(stale.get("/api/v2/session"), 401)


def test_workspace_keys_tokens_and_bad_keys_cannot_sign_in(
    app_daemon: InProcess, browser_like: httpx.Client
) -> None:
    workspace_key = app_daemon.key(kind="workspace", workspace_id=app_daemon.workspace_id)
    refused = browser_like.post("/api/v2/session", json={"apiKey": workspace_key})
    envelope(refused, 403, "WORKSPACE_KEY_NOT_ALLOWED")
    store = app_daemon.store()
    try:
        user = store.ensure_user("ada@example.com")
        _, token = store.create_key(kind="token", user_id=user.id, scopes=("api:read",))
    finally:
        store.close()
    envelope(
        browser_like.post("/api/v2/session", json={"apiKey": token}), 403, "PERSONAL_KEY_REQUIRED"
    )
    envelope(browser_like.post("/api/v2/session", json={"apiKey": "rk_p_nope"}), 401)
    assert "set-cookie" not in refused.headers


def test_a_login_link_signs_in_once_and_expires(
    app_daemon: InProcess, browser_like: httpx.Client
) -> None:
    printed = run_cli(
        "admin",
        "login-link",
        "--email",
        "ada@example.com",
        "--url",
        app_daemon.url,
        "--json",
        env=app_daemon.env,
    )
    assert printed.returncode == 0, printed.stderr
    link = json.loads(printed.stdout)
    assert link["expiresInSeconds"] == 600
    assert link["url"].startswith(f"{app_daemon.url}/login#token=")
    token = link["url"].split("#token=", 1)[1]
    assert _sign_in(browser_like, loginToken=token)["email"] == "ada@example.com"
    again = app_daemon.fresh("POST", "/api/v2/session", json={"loginToken": token})
    assert "used already or has expired" in envelope(again, 401)["message"]

    store = app_daemon.store()
    try:
        user = store.ensure_user("ada@example.com")
        expired = store.create_login_link(user.id, ttl_s=-1)
    finally:
        store.close()
    envelope(app_daemon.fresh("POST", "/api/v2/session", json={"loginToken": expired}), 401)
    unknown = run_cli("admin", "login-link", "--email", "nobody@example.com", env=app_daemon.env)
    assert unknown.returncode == 1 and "no person" in unknown.stderr


def test_the_input_check_refuses_with_the_pointer_and_runs_nothing(
    app_daemon: InProcess, install: str
) -> None:
    path = f"/api/v2/apps/installs/{install}/tools/score_offer/check"
    assert app_daemon.call("POST", path, app_daemon.admin_key, json={"input": GOOD}).json() == {
        "valid": True
    }
    bad = app_daemon.call(
        "POST", path, app_daemon.admin_key, json={"input": {**GOOD, "discountPct": 150}}
    )
    assert envelope(bad, 400, "INVALID_INPUT")["details"]["pointer"] == "/discountPct"
    viewer = app_daemon.person("vic@example.com", role="viewer")
    envelope(app_daemon.call("POST", path, viewer, json={"input": GOOD}), 403)


def test_a_tools_detail_shows_packages_and_the_grant(app_daemon: InProcess, install: str) -> None:
    found = app_daemon.call(
        "GET", f"/api/v2/apps/installs/{install}/tools/score_offer", app_daemon.admin_key
    ).json()
    assert found["tool"]["reference"] == "deal-desk/score_offer"
    assert found["packages"] == [] and found["egress"] == []
    assert "source" not in json.dumps(found)
    missing = app_daemon.call(
        "GET", f"/api/v2/apps/installs/{install}/tools/nope", app_daemon.admin_key
    )
    assert missing.status_code == 404


def test_people_and_keys(app_daemon: InProcess) -> None:
    base = f"/api/v2/workspaces/{app_daemon.workspace_id}"
    added = app_daemon.call(
        "PUT",
        f"{base}/members",
        app_daemon.admin_key,
        json={"email": "new@example.com", "role": "builder", "appsAccess": True},
    )
    assert added.status_code == 200 and added.json()["role"] == "builder"
    members = app_daemon.call("GET", f"{base}/members", app_daemon.admin_key).json()["data"]
    assert {"new@example.com", "ada@example.com"} <= {m["email"] for m in members}

    made = app_daemon.call(
        "POST",
        f"{base}/keys",
        app_daemon.admin_key,
        json={"kind": "personal", "name": "laptop", "email": "new@example.com"},
    )
    assert made.status_code == 201, made.text
    plaintext, key_id = made.json()["apiKey"], made.json()["key"]["keyId"]
    assert (
        app_daemon.call(
            "GET", "/api/v2/apps", plaintext, params={"workspaceId": app_daemon.workspace_id}
        ).status_code
        == 200
    )
    listed = app_daemon.call("GET", f"{base}/keys", app_daemon.admin_key).text
    assert key_id in listed and plaintext not in listed
    outsider = app_daemon.call(
        "POST",
        f"{base}/keys",
        app_daemon.admin_key,
        json={"kind": "personal", "email": "stranger@example.com"},
    )
    envelope(outsider, 400, "NOT_A_MEMBER")
    builder = app_daemon.person("bob@example.com", role="builder")
    envelope(app_daemon.call("GET", f"{base}/members", builder), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    assert app_daemon.call("DELETE", f"{base}/keys/{key_id}", app_daemon.admin_key).json()[
        "revoked"
    ]
    envelope(
        app_daemon.call(
            "GET", "/api/v2/apps", plaintext, params={"workspaceId": app_daemon.workspace_id}
        ),
        401,
    )


def test_an_admin_makes_or_revokes_keys_only_of_people_in_no_workspace_beyond_theirs(
    app_daemon: InProcess,
) -> None:
    """A personal key acts in every workspace of its person: the admin of one workspace
    may not mint one, nor end one, for a person who is also in a workspace where that
    admin has no say (here: a viewer here who is the admin of another workspace)."""
    base = f"/api/v2/workspaces/{app_daemon.workspace_id}"
    store = app_daemon.store()
    try:
        other = store.create_workspace("Hers").id
    finally:
        store.close()
    theirs = app_daemon.person("hopper@example.com", role="admin", workspace_id=other)
    app_daemon.person("hopper@example.com", role="viewer")  # and a viewer here
    minted = app_daemon.call(
        "POST", f"{base}/keys", app_daemon.admin_key,
        json={"kind": "personal", "email": "hopper@example.com"},
    )  # fmt: skip
    envelope(minted, 403, "KEYS_BEYOND_YOUR_WORKSPACES")
    token = app_daemon.call(
        "POST", f"{base}/keys", app_daemon.admin_key,
        json={"kind": "token", "email": "hopper@example.com", "scopes": ["tools:run"]},
    )  # fmt: skip
    envelope(token, 403, "KEYS_BEYOND_YOUR_WORKSPACES")
    # Her own key (made in her workspace) acts here too, so it is listed; it is not ours
    # to end: removing her from this workspace is.
    listed = app_daemon.call("GET", f"{base}/keys", app_daemon.admin_key).json()["data"]
    hers = next(k for k in listed if k.get("email") == "hopper@example.com")
    envelope(
        app_daemon.call("DELETE", f"{base}/keys/{hers['keyId']}", app_daemon.admin_key),
        403,
        "KEYS_BEYOND_YOUR_WORKSPACES",
    )
    assert (
        app_daemon.call("GET", f"/api/v2/workspaces/{other}/members", theirs).status_code == 200
    )  # her key still works where she is admin
    # She herself may make her keys anywhere she is a member.
    own = app_daemon.call(
        "POST", f"{base}/keys", theirs, json={"kind": "personal", "email": "hopper@example.com"}
    )
    envelope(own, 403, "INSUFFICIENT_WORKSPACE_ROLE")  # a viewer here: not an admin
    mine = app_daemon.call(
        "POST", f"/api/v2/workspaces/{other}/keys", theirs, json={"kind": "personal"}
    )
    assert mine.status_code == 201, mine.text


def test_the_only_admin_is_never_demoted_nor_taken_out(app_daemon: InProcess) -> None:
    """Over the API and the host's CLI alike: with one admin, making them a builder, or
    taking them out, is 409 LAST_ADMIN and changes nothing; with a second admin, it works."""
    store = app_daemon.store()
    try:
        alone = store.create_workspace("Alone").id
    finally:
        store.close()
    solo = app_daemon.person("solo@example.com", role="admin", workspace_id=alone)
    base = f"/api/v2/workspaces/{alone}"
    members = app_daemon.call("GET", f"{base}/members", solo).json()["data"]
    [me] = [m["userId"] for m in members]
    demoted = app_daemon.call(
        "PUT", f"{base}/members", solo, json={"email": "solo@example.com", "role": "builder"}
    )
    envelope(demoted, 409, "LAST_ADMIN")
    envelope(app_daemon.call("DELETE", f"{base}/members/{me}", solo), 409, "LAST_ADMIN")
    cli = run_cli(
        "admin", "set-role", "--workspace", alone, "--email", "solo@example.com",
        "--role", "viewer", "--data-dir", str(app_daemon.data_dir),
        env={"RUNNERD_DATABASE_URL": app_daemon.env.get("RUNNERD_DATABASE_URL", "")},
    )  # fmt: skip
    assert cli.returncode == 1 and "only admin" in cli.stderr, cli.stderr
    roles = {
        m["email"]: m["role"]
        for m in app_daemon.call("GET", f"{base}/members", solo).json()["data"]
    }
    assert roles == {"solo@example.com": "admin"}

    added = app_daemon.call(
        "PUT", f"{base}/members", solo, json={"email": "duo@example.com", "role": "admin"}
    )
    assert added.status_code == 200, added.text
    stepped_down = app_daemon.call(
        "PUT", f"{base}/members", solo, json={"email": "solo@example.com", "role": "builder"}
    )
    assert stepped_down.status_code == 200, stepped_down.text


def test_every_answer_carries_the_security_headers(app_daemon: InProcess) -> None:
    for path in ("/", "/static/app.js", "/api/v2/apps/tools?workspaceId=x", "/healthz"):
        headers = app_daemon.fresh("GET", path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
    # What the API answers (a session's CSRF token, a frame token, a person's data) is
    # kept by no cache.
    for path in ("/api/v2/session", "/api/v2/apps/tools?workspaceId=x"):
        assert app_daemon.fresh("GET", path).headers["cache-control"] == "no-store", path
    page = app_daemon.fresh("GET", "/").text
    assert '<script type="module" src="/static/app.js"></script>' in page
    assert "<script>" not in page and "style=" not in page


# --- a session lives no longer than its key, and has no more rights than its person ---------


def _key_id(daemon: Runnerd, plaintext: str) -> str:
    listed = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/keys", daemon.admin_key
    ).json()["data"]
    [found] = [k["keyId"] for k in listed if plaintext.startswith(k["prefix"])]
    return str(found)


def _user_id(daemon: Runnerd, email: str) -> str:
    members = daemon.call(
        "GET", f"/api/v2/workspaces/{daemon.workspace_id}/members", daemon.admin_key
    ).json()["data"]
    return str(next(m["userId"] for m in members if m["email"] == email))


def test_a_request_with_two_session_cookies_is_signed_out(app_daemon: InProcess) -> None:
    """A browser holding a session cookie someone else tossed in (set for a parent domain
    or by a page of the same host) sends two: neither is taken, whichever comes first."""
    mine, theirs = app_daemon.client(), app_daemon.client()
    _sign_in(mine, apiKey=app_daemon.admin_key)
    _sign_in(theirs, apiKey=app_daemon.person("tosser@example.com", role="member"))
    own = mine.cookies["runnerd_session"]
    tossed = theirs.cookies["runnerd_session"]
    for first, second in ((own, tossed), (tossed, own)):
        header = {"Cookie": f"runnerd_session={first}; other=1; runnerd_session={second}"}
        envelope(app_daemon.fresh("GET", "/api/v2/session", headers=header), 401)
    alone = app_daemon.fresh("GET", "/api/v2/session", headers={"Cookie": f"runnerd_session={own}"})
    assert alone.status_code == 200, alone.text
    mine.close()
    theirs.close()


def test_over_https_the_session_cookie_is_a_host_cookie(app_daemon: InProcess) -> None:
    """Over HTTPS (a TLS proxy in front, or the daemon's own), the cookie is
    __Host-runnerd_session: Secure, host-only, path /, which no sibling host or parent
    domain can set; the plain name is not read there."""
    with httpx.Client(base_url="https://testserver", transport=app_daemon._transport) as tls:
        made = tls.post("/api/v2/session", json={"apiKey": app_daemon.admin_key})
        assert made.status_code == 200, made.text
        cookie = made.headers["set-cookie"]
        assert cookie.startswith("__Host-runnerd_session=") and "Secure" in cookie, cookie
        assert "Domain" not in cookie and "Path=/" in cookie, cookie
        assert tls.get("/api/v2/session").status_code == 200
        value = tls.cookies["__Host-runnerd_session"]
    with httpx.Client(base_url="https://testserver", transport=app_daemon._transport) as other:
        plain = other.get("/api/v2/session", headers={"Cookie": f"runnerd_session={value}"})
        envelope(plain, 401)


def test_a_session_dies_with_the_key_it_signed_in_with(
    app_daemon: InProcess, browser_like: httpx.Client
) -> None:
    """An admin's session made with personal key K: once another admin revokes K, the
    session's next read and its next change (CSRF token and all) are 401, and the
    audit says which sessions ended. A session of the same person from a sign-in link,
    and one from another key of theirs, live on."""
    base = f"/api/v2/workspaces/{app_daemon.workspace_id}"
    key = app_daemon.person("grace@example.com", role="admin")
    other_key = app_daemon.person("grace@example.com", role="admin")
    info = _sign_in(browser_like, apiKey=key)
    csrf = {"X-CSRF-Token": str(info["csrfToken"])}
    assert browser_like.get(f"{base}/members").status_code == 200
    elsewhere = app_daemon.client()
    _sign_in(elsewhere, apiKey=other_key)
    store = app_daemon.store()
    try:
        user = store.ensure_user("grace@example.com")
        token = store.create_login_link(user.id, ttl_s=60)
    finally:
        store.close()
    by_link = app_daemon.client()
    _sign_in(by_link, loginToken=token)

    key_id = _key_id(app_daemon, key)
    revoked = app_daemon.call("DELETE", f"{base}/keys/{key_id}", app_daemon.admin_key)
    assert revoked.status_code == 200, revoked.text
    envelope(browser_like.get("/api/v2/session"), 401)
    envelope(browser_like.get(f"{base}/members"), 401)
    made = browser_like.put(
        f"{base}/members", json={"email": "sneak@example.com", "role": "admin"}, headers=csrf
    )
    envelope(made, 401)
    members = app_daemon.call("GET", f"{base}/members", app_daemon.admin_key).json()["data"]
    assert "sneak@example.com" not in {m["email"] for m in members}
    assert elsewhere.get(f"{base}/members").status_code == 200
    assert by_link.get(f"{base}/members").status_code == 200
    entries = app_daemon.call(
        "GET",
        "/api/v2/audit",
        app_daemon.admin_key,
        params={"workspaceId": app_daemon.workspace_id, "action": "key.revoke", "limit": 1000},
    ).json()["data"]
    [entry] = [e for e in entries if e["detail"]["keyId"] == key_id]
    assert len(entry["detail"]["sessionsEnded"]) == 1
    assert entry["actorUserId"] == _user_id(app_daemon, "ada@example.com")


def test_a_session_loses_rights_at_once_when_the_role_drops_or_the_person_leaves(
    app_daemon: InProcess, install: str, browser_like: httpx.Client
) -> None:
    base = f"/api/v2/workspaces/{app_daemon.workspace_id}"
    info = _sign_in(browser_like, apiKey=app_daemon.person("hedy@example.com", role="admin"))
    csrf = {"X-CSRF-Token": str(info["csrfToken"])}
    user_id = _user_id(app_daemon, "hedy@example.com")
    assert browser_like.get(f"{base}/members").status_code == 200

    for role in ("member", "viewer"):
        dropped = app_daemon.call(
            "PUT",
            f"{base}/members",
            app_daemon.admin_key,
            json={"email": "hedy@example.com", "role": role},
        )
        assert dropped.status_code == 200, dropped.text
        envelope(browser_like.get(f"{base}/members"), 403, "INSUFFICIENT_WORKSPACE_ROLE")
        envelope(
            browser_like.put(
                f"{base}/members", json={"email": "hedy@example.com", "role": "admin"}, headers=csrf
            ),
            403,
            "INSUFFICIENT_WORKSPACE_ROLE",
        )
        assert browser_like.get("/api/v2/session").json()["workspaces"][0]["role"] == role
    assert browser_like.get(f"/api/v2/apps/installs/{install}/runs").status_code == 200

    envelope(app_daemon.call("DELETE", f"{base}/members/usr_nobody", app_daemon.admin_key), 404)
    removed = app_daemon.call("DELETE", f"{base}/members/{user_id}", app_daemon.admin_key)
    assert removed.status_code == 200, removed.text
    assert "hedy@example.com" not in {m["email"] for m in removed.json()["data"]}
    assert browser_like.get("/api/v2/session").json()["workspaces"] == []
    envelope(browser_like.get(f"/api/v2/apps/installs/{install}/runs"), 404)
    envelope(browser_like.get("/api/v2/apps", params={"workspaceId": app_daemon.workspace_id}), 403)

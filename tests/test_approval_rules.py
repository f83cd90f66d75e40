"""Approvals a person can decide: each app's approval rule says who approves its write
calls from a relay (chat stays the asker's); the people who may decide a pending approval
see its held input, nobody else does; a workspace's webhook hears, signed and retried, that
an approval waits, without the input. Through the daemon's app in this process (nothing
runs), but for the page test, which approves on a real daemon in Chromium."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import RUNNERD, write_app
from daemon import Runnerd, envelope, running_daemon
from inproc import InProcess
from test_governance import audit

BACKENDS = ("sqlite", "postgresql")
DAEMON_SETTINGS = {"approval_ttl_s": "600", "webhook_retry_s": "0.3"}

SEND_INPUT = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "title": "Recipient", "description": "Who gets the payment"},
        "amount": {"type": "number", "title": "Amount"},
        "meta": {"type": "object", "title": "Metadata"},
    },
    "required": ["to"],
}


def relay_app(root: Path) -> Path:
    """`send`, a write tool with an input schema of titled properties."""
    return write_app(
        root,
        "payouts",
        {"send": "def run(i):\n    return {'sent': i['to']}\n"},
        docs={"send": {"description": "pay someone", "effect": "write", "input": SEND_INPUT}},
    )


@pytest.fixture(scope="module")
def payouts(
    app_daemon: InProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[InProcess, str]:
    install = app_daemon.ship(relay_app(tmp_path_factory.mktemp("payouts")))
    return app_daemon, str(install["installId"])


def _user_id(d: Runnerd, email: str) -> str:
    store = d.store()
    try:
        return store.ensure_user(email).id
    finally:
        store.close()


def _approver(d: Runnerd, email: str) -> str:
    """A member with the approver flag; their key."""
    key = d.person(email)
    store = d.store()
    try:
        store.set_membership(d.workspace_id, store.ensure_user(email).id, approver=True)
    finally:
        store.close()
    return key


def _rule(d: Runnerd, body: Any, key: str | None = None, app: str = "payouts") -> Any:
    return d.call(
        "PUT",
        f"/api/v2/workspaces/{d.workspace_id}/approval-rules/{app}",
        key or d.admin_key,
        json=body,
    )


def _listed(d: Runnerd, key: str, approval_id: str) -> dict[str, Any]:
    response = d.call("GET", "/api/v2/approvals", key, params={"workspaceId": d.workspace_id})
    assert response.status_code == 200, response.text
    return next(a for a in response.json()["data"] if a["approvalId"] == approval_id)


def _held(d: Runnerd, iid: str, key: str, surface: str, value: Any) -> str:
    answer = d.run(iid, "send", value, key=key, surface=surface)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["approvalId"])


def _drop_rule(d: Runnerd) -> None:
    d.call("DELETE", f"/api/v2/workspaces/{d.workspace_id}/approval-rules/payouts", d.admin_key)


# --- who approves ---------------------------------------------------------------------------


def test_an_apps_rule_replaces_the_approver_flag_for_its_relay_calls(
    payouts: tuple[InProcess, str],
) -> None:
    d, iid = payouts
    asker = d.person("rule-asker@example.com")
    builder = d.person("rule-builder@example.com", role="builder")
    flagged = _approver(d, "rule-flagged@example.com")
    before = _held(d, iid, asker, "relay", {"to": "a"})
    # The workspace default: the approver flag decides, a builder does not.
    assert _listed(d, flagged, before)["mayDecide"] is True
    assert _listed(d, builder, before)["mayDecide"] is False

    set_rule = _rule(d, {"roles": ["builder"]})
    assert set_rule.status_code == 200, set_rule.text
    assert set_rule.json()["roles"] == ["builder"] and set_rule.json()["userIds"] == []
    try:
        held = _held(d, iid, asker, "relay", {"to": "b"})
        assert _listed(d, builder, held)["mayDecide"] is True
        assert _listed(d, flagged, held)["mayDecide"] is False
        assert _listed(d, d.admin_key, held)["mayDecide"] is False  # admins are not in it
        envelope(d.call("POST", f"/api/v2/approvals/{held}/deny", flagged), 403, "NOT_AN_APPROVER")
        envelope(
            d.call("POST", f"/api/v2/approvals/{held}/deny", d.admin_key), 403, "NOT_AN_APPROVER"
        )
        denied = d.call("POST", f"/api/v2/approvals/{held}/deny", builder)
        assert denied.status_code == 200 and denied.json()["status"] == "denied", denied.text
        # The rule counts when deciding, not when asking: one held before it follows it too.
        assert _listed(d, flagged, before)["mayDecide"] is False

        # Chat is unchanged: the person who asked decides, whatever the rule says.
        chat = _held(d, iid, asker, "chat", {"to": "c"})
        assert _listed(d, builder, chat)["mayDecide"] is False
        envelope(d.call("POST", f"/api/v2/approvals/{chat}/deny", builder), 403, "NOT_AN_APPROVER")
        assert _listed(d, asker, chat)["mayDecide"] is True
        assert d.call("POST", f"/api/v2/approvals/{chat}/deny", asker).status_code == 200
    finally:
        _drop_rule(d)
    assert _listed(d, flagged, before)["mayDecide"] is True  # back to the default
    entries = [e for e in audit(d) if e["action"].startswith("approval_rule.")]
    assert [e["action"] for e in entries][-2:] == ["approval_rule.set", "approval_rule.delete"]
    admin_id = _user_id(d, "ada@example.com")
    assert all(e["actorUserId"] == admin_id and e["actorKeyId"] for e in entries)
    assert entries[-2]["detail"]["roles"] == ["builder"]


def test_a_rule_may_name_people(payouts: tuple[InProcess, str]) -> None:
    d, iid = payouts
    asker = d.person("named-asker@example.com")
    named = d.person("named-decider@example.com")
    other = d.person("named-other@example.com", role="builder")
    named_id = _user_id(d, "named-decider@example.com")
    answer = _rule(d, {"roles": [], "userIds": [named_id]})
    assert answer.status_code == 200, answer.text
    try:
        listed = d.call(
            "GET", f"/api/v2/workspaces/{d.workspace_id}/approval-rules", d.admin_key
        ).json()["data"]
        assert [(r["appSlug"], r["userIds"]) for r in listed] == [("payouts", [named_id])]
        held = _held(d, iid, asker, "relay", {"to": "n"})
        assert _listed(d, named, held)["mayDecide"] is True
        assert _listed(d, other, held)["mayDecide"] is False
        envelope(d.call("POST", f"/api/v2/approvals/{held}/deny", other), 403, "NOT_AN_APPROVER")
        assert d.call("POST", f"/api/v2/approvals/{held}/deny", named).status_code == 200
    finally:
        _drop_rule(d)


def test_rules_are_checked_and_only_admins_set_them(payouts: tuple[InProcess, str]) -> None:
    d, _ = payouts
    builder = d.person("rule-setter@example.com", role="builder")
    d.person("rule-viewer@example.com", role="viewer")
    envelope(_rule(d, {"roles": ["builder"]}, key=builder), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    envelope(
        d.call("GET", f"/api/v2/workspaces/{d.workspace_id}/approval-rules", builder),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )
    error = envelope(_rule(d, {"roles": [], "userIds": []}), 400, "INVALID_APPROVAL_RULE")
    assert error["details"]["field"] == "roles"
    stranger = _user_id(d, "not-in-workspace@example.com")
    error = envelope(_rule(d, {"userIds": [stranger]}), 400, "INVALID_APPROVAL_RULE")
    assert error["details"]["field"] == "userIds"
    viewer = _user_id(d, "rule-viewer@example.com")
    envelope(_rule(d, {"userIds": [viewer]}), 400, "INVALID_APPROVAL_RULE")  # cannot decide
    envelope(_rule(d, {"roles": ["viewer"]}), 400, "INVALID_BODY")
    envelope(_rule(d, {"roles": ["admin"]}, app="no-such-app"), 404, "APP_NOT_FOUND")
    assert d.call(
        "GET", f"/api/v2/workspaces/{d.workspace_id}/approval-rules", d.admin_key
    ).json() == {"data": []}


# --- the held input, to deciders only --------------------------------------------------------


def test_the_held_input_is_shown_to_deciders_only(payouts: tuple[InProcess, str]) -> None:
    d, iid = payouts
    asker = d.person("input-asker@example.com")
    member = d.person("input-member@example.com")
    viewer = d.person("input-viewer@example.com", role="viewer")
    marker = "held-" + os.urandom(6).hex()
    value = {"to": marker, "amount": 12.5, "meta": {"ref": [1, 2]}}
    held = _held(d, iid, asker, "relay", value)

    for path in (None, f"/api/v2/approvals/{held}"):
        seen = (
            _listed(d, d.admin_key, held)
            if path is None
            else d.call("GET", path, d.admin_key).json()
        )
        assert seen["mayDecide"] is True
        assert seen["input"] == value
        assert seen["inputSchema"] == SEND_INPUT
        assert seen["requestedByEmail"] == "input-asker@example.com"
        assert seen["appSlug"] == "payouts" and seen["tool"] == "send"
        assert seen["surface"] == "relay" and seen["expiresAt"] > seen["createdAt"]

    # A member who may not decide it, and the asker of a relay call, see no input.
    for key in (member, asker):
        for seen in (
            _listed(d, key, held),
            d.call("GET", f"/api/v2/approvals/{held}", key).json(),
        ):
            assert seen["mayDecide"] is False
            assert not {"input", "inputSchema", "requestedByEmail"} & set(seen)
            assert marker not in json.dumps(seen)
    envelope(
        d.call("GET", "/api/v2/approvals", viewer, params={"workspaceId": d.workspace_id}),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )
    envelope(d.call("GET", f"/api/v2/approvals/{held}", viewer), 403, "INSUFFICIENT_WORKSPACE_ROLE")
    outsider = d.key(kind="personal", user_id=_user_id(d, "input-outsider@example.com"))
    envelope(d.call("GET", f"/api/v2/approvals/{held}", outsider), 404, "APPROVAL_NOT_FOUND")
    envelope(d.call("GET", "/api/v2/approvals/apr_nope", d.admin_key), 404, "APPROVAL_NOT_FOUND")

    # Decided: the sealed input is gone, and so is what deciders saw.
    assert d.call("POST", f"/api/v2/approvals/{held}/deny", d.admin_key).status_code == 200
    after = d.call("GET", f"/api/v2/approvals/{held}", d.admin_key).json()
    assert after["status"] == "denied" and "input" not in after
    assert marker not in json.dumps(audit(d))
    assert marker not in (d.data_dir / "serve.log").read_text()


# --- the webhook ----------------------------------------------------------------------------


class _Receiver:
    """A loopback HTTP server that answers 500 to the first ``failures`` deliveries, then
    204; it keeps each delivery's headers and body. With ``hold_first``, the first one
    gets no answer until ``release`` is set (10 s at most)."""

    def __init__(self, failures: int, hold_first: bool = False) -> None:
        self.failures, self.hold_first = failures, hold_first
        self.got: list[tuple[dict[str, str], bytes, int]] = []
        self.arrived = threading.Event()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                failing = len(receiver.got) < receiver.failures
                if not receiver.got and receiver.hold_first:
                    receiver.release.wait(10)
                status = 500 if failing else 204
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if not failing:
                    receiver.arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/runnerd?token=t0k"

    @contextmanager
    def serving(self) -> Iterator[_Receiver]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


def _verify(secret: str, headers: dict[str, str], body: bytes) -> None:
    """What docs/GOVERNANCE.md tells a receiver to check."""
    parts = dict(p.split("=", 1) for p in headers["runnerd-signature"].split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
    assert hmac.compare_digest(parts["v1"], expected.hexdigest())
    assert abs(time.time() - int(parts["t"])) < 300


def test_a_waiting_approval_is_delivered_signed_and_retried_without_its_input(
    payouts: tuple[InProcess, str],
) -> None:
    d, iid = payouts
    hook = f"/api/v2/workspaces/{d.workspace_id}/webhook"
    asker = d.person("hook-asker@example.com")
    envelope(d.call("GET", hook, d.admin_key), 404, "WEBHOOK_NOT_FOUND")
    builder = d.person("hook-builder@example.com", role="builder")
    envelope(
        d.call("PUT", hook, builder, json={"url": "http://127.0.0.1:9/x"}),
        403,
        "INSUFFICIENT_WORKSPACE_ROLE",
    )
    for bad in ("ftp://example.com/x", "file:///etc/passwd", "http://user:pw@example.com/x",
                "http://127.0.0.1:8686/api", "http://localhost:8686/x"):  # fmt: skip
        error = envelope(
            d.call("PUT", hook, d.admin_key, json={"url": bad}), 400, "INVALID_WEBHOOK_URL"
        )
        assert error["details"]["field"] == "url"

    receiver = _Receiver(failures=1, hold_first=True)
    with receiver.serving():
        made = d.call("PUT", hook, d.admin_key, json={"url": receiver.url})
        assert made.status_code == 200, made.text
        secret = made.json()["secret"]
        assert secret.startswith("whsec_")
        shown = d.call("GET", hook, d.admin_key).json()
        assert shown["url"] == receiver.url and "secret" not in shown
        again = d.call("PUT", hook, d.admin_key, json={"url": receiver.url}).json()
        assert "secret" not in again  # kept: shown once

        marker = "hooked-" + os.urandom(6).hex()
        started = time.monotonic()
        held = _held(d, iid, asker, "relay", {"to": marker})
        # The call does not wait for the webhook: its first delivery is still unanswered
        # (it would be for 10 s).
        assert time.monotonic() - started < 5 and not receiver.got
        receiver.release.set()
        assert receiver.arrived.wait(15), receiver.got
        # A chat call is its asker's to decide: not announced.
        chat = _held(d, iid, asker, "chat", {"to": "chat-" + marker})
        time.sleep(1.5)
        assert len(receiver.got) == 2, receiver.got
        d.call("POST", f"/api/v2/approvals/{chat}/deny", asker)

    assert [status for _, _, status in receiver.got] == [500, 204]  # retried once
    (first, _, _), (headers, body, _) = receiver.got
    _verify(secret, headers, body)
    assert first["runnerd-delivery"] == headers["runnerd-delivery"]  # one delivery, twice
    assert headers["runnerd-event"] == "approval.waiting"
    sent = json.loads(body)
    assert sent == {
        "type": "approval.waiting",
        "approvalId": held,
        "workspaceId": d.workspace_id,
        "app": "payouts",
        "installId": iid,
        "tool": "send",
        "surface": "relay",
        "askedBy": "hook-asker@example.com",
        "askedAt": sent["askedAt"],
        "expiresAt": _listed(d, d.admin_key, held)["expiresAt"],
        "url": sent["url"],
    }
    assert sent["url"].endswith("/#/approvals")
    assert marker not in body.decode()
    with pytest.raises(AssertionError):  # a wrong secret does not verify
        _verify(secret + "x", headers, body)

    entries = [e for e in audit(d) if e["action"].startswith("webhook.")]
    assert [e["detail"]["newSecret"] for e in entries] == [True, False]
    assert all("t0k" not in json.dumps(e) and e["actorUserId"] for e in entries)
    assert secret not in json.dumps(audit(d))
    store = d.store()
    try:
        row = store.webhook(d.workspace_id)
        assert row is not None and secret.encode() not in row.secret_sealed
    finally:
        store.close()
    log = (d.data_dir / "serve.log").read_text()
    assert "HTTP 500" in log and "t0k" not in log and marker not in log
    assert d.call("DELETE", hook, d.admin_key).json() == {"deleted": True}
    envelope(d.call("DELETE", hook, d.admin_key), 404, "WEBHOOK_NOT_FOUND")
    d.call("POST", f"/api/v2/approvals/{held}/deny", d.admin_key)


def test_a_webhooks_secret_outlives_a_secrets_key_rotation(payouts: tuple[InProcess, str]) -> None:
    """Its secret is sealed like the secrets: a rotation seals it again, under the new
    key, and deliveries go on being signed with the same secret."""
    d, iid = payouts
    hook = f"/api/v2/workspaces/{d.workspace_id}/webhook"
    receiver = _Receiver(failures=0)
    with receiver.serving():
        secret = d.call("PUT", hook, d.admin_key, json={"url": receiver.url}).json()["secret"]
        store = d.store()
        try:
            before = store.webhook(d.workspace_id)
        finally:
            store.close()
        rotated = subprocess.run([RUNNERD, "admin", "rotate-secrets-key", "--json"],
                                 capture_output=True, text=True, env=d.env)  # fmt: skip
        assert rotated.returncode == 0, rotated.stderr
        store = d.store()
        try:
            after = store.webhook(d.workspace_id)
        finally:
            store.close()
        assert before is not None and after is not None
        assert after.secret_kid != before.secret_kid
        held = _held(d, iid, d.person("rotated-asker@example.com"), "relay", {"to": "r"})
        assert receiver.arrived.wait(15), receiver.got
    headers, body, _ = receiver.got[0]
    _verify(secret, headers, body)
    assert json.loads(body)["approvalId"] == held
    d.call("DELETE", hook, d.admin_key)
    d.call("POST", f"/api/v2/approvals/{held}/deny", d.admin_key)


def test_a_webhook_that_came_to_reach_runnerd_itself_is_not_delivered_to(
    payouts: tuple[InProcess, str],
) -> None:
    """The URL check is made again at each try (the URL may resolve elsewhere by then,
    or public_url change): a webhook stored with this runnerd's own address (the route
    refuses it; here it is written to the store directly) gets nothing; once removed, no
    more tries."""
    from runnerd.store.approval_rules import webhook_sealed_name
    from runnerd.vault import Vault

    d, iid = payouts
    vault = Vault.from_settings(None, d.data_dir / "secrets.key")
    store = d.store()
    try:
        sealed = vault.seal(d.workspace_id, webhook_sealed_name(d.workspace_id), "whsec_x")
        store.set_webhook(d.workspace_id, "http://127.0.0.1:8686/api/v2/approvals",
                          sealed=sealed, actor_user_id=None, actor_key_id=None)  # fmt: skip
    finally:
        store.close()
    held = _held(d, iid, d.person("self-asker@example.com"), "relay", {"to": "s"})
    log = d.data_dir / "serve.log"
    deadline = time.monotonic() + 10
    while "reaches this runnerd itself" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "refused: it reaches this runnerd itself (try 1 of 5" in log.read_text()
    # Removed, it gets no more tries (they would come 0.3 s, then 0.9 s, after the first).
    d.call("DELETE", f"/api/v2/workspaces/{d.workspace_id}/webhook", d.admin_key)
    time.sleep(1.5)
    assert "try 2 of 5" not in log.read_text()
    d.call("POST", f"/api/v2/approvals/{held}/deny", d.admin_key)


# --- the page -------------------------------------------------------------------------------


@pytest.mark.jail
@pytest.mark.browser
def test_the_page_sets_who_approves_and_shows_the_input_escaped(
    toolchain_dir: Path, tmp_path: Path
) -> None:
    """An admin sets the app's rule on the Approvals screen; a builder it names sees the
    held input, rendered with the tool's schema and as text (no markup runs), approves
    it, and it runs once."""
    from test_manage_page import Page, _chromium

    sync_api = pytest.importorskip("playwright.sync_api")
    hostile = "<img src=x onerror=\"document.title='pwned'\">"
    with running_daemon(toolchain_dir, approval_ttl_s="600", warm_jails="0") as d, \
            sync_api.sync_playwright() as playwright:  # fmt: skip
        iid = d.ship(relay_app(tmp_path / "payouts"))["installId"]
        asker = d.person("page-asker@example.com")
        builder = d.person("page-builder@example.com", role="builder")
        browser = playwright.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            admin = Page(browser, d)
            admin.sign_in(d.admin_key)
            admin.open("/#/approvals")
            editor = admin.tab.locator("[data-rule-app=payouts]")
            editor.locator("input[value=builder]").check()
            editor.locator("input[value=admin]").uncheck()
            editor.locator("button:has-text('Save')").click()
            admin.tab.wait_for_selector("#toast:has-text('Saved who approves payouts')")
            admin.tab.wait_for_selector("[data-rule-app=payouts] :text('this rule')")
            admin.shot("approvals-rules")
            rules = d.call(
                "GET", f"/api/v2/workspaces/{d.workspace_id}/approval-rules", d.admin_key
            ).json()["data"]
            assert [(r["appSlug"], r["roles"]) for r in rules] == [("payouts", ["builder"])]
            admin.close()

            value = {"to": hostile, "amount": 3, "meta": {"note": hostile}}
            held = d.run(iid, "send", value, key=asker, surface="relay").json()["approvalId"]
            page = Page(browser, d)
            page.sign_in(builder)
            page.open("/#/approvals")
            row = page.tab.locator(f"[data-approval='{held}']")
            row.wait_for()
            fields = row.locator(".held-input")
            assert fields.locator("dt").all_inner_texts()[:3] == ["Recipient", "Amount", "Metadata"]
            assert "Who gets the payment" in fields.inner_text()
            assert fields.locator("dd").first.inner_text().startswith(hostile)
            assert json.loads(fields.locator("pre").inner_text()) == {"note": hostile}
            assert fields.locator("img").count() == 0
            assert "page-asker@example.com" in row.inner_text()
            page.shot("approvals-input")
            page.tab.locator(f"[data-approval='{held}'] button:has-text('Approve')").click()
            page.tab.wait_for_selector("#toast:has-text('Approved')")
            assert page.tab.title() != "pwned"
            page.close()
        finally:
            browser.close()
        decided = d.call("GET", f"/api/v2/approvals/{held}", d.admin_key).json()
        assert decided["status"] == "approved" and decided["decidedBy"] == _user_id(
            d, "page-builder@example.com"
        )
        run = d.ended_run(decided["runId"], asker)
        assert run["run"]["status"] == "succeeded" and run["output"] == {"sent": hostile}

"""Every People/keys/sign-in action over the API is attributed in the audit trail: who
did it, with which key, and in which workspace."""

from __future__ import annotations

import uuid

from inproc import InProcess
from test_governance import audit


def test_admin_actions_on_another_person_are_attributed(app_daemon: InProcess) -> None:
    d, ws = app_daemon, app_daemon.workspace_id
    me = d.call("GET", "/api/v2/session", d.admin_key).json()
    admin_id = me["userId"]
    keys = d.call("GET", f"/api/v2/workspaces/{ws}/keys", d.admin_key).json()["data"]
    admin_key_id = next(k["keyId"] for k in keys if k["userId"] == admin_id)
    email = f"p-{uuid.uuid4().hex[:8]}@example.com"

    def put(role: str) -> str:
        r = d.call("PUT", f"/api/v2/workspaces/{ws}/members", d.admin_key,
                   json={"email": email, "role": role})  # fmt: skip
        assert r.status_code == 200, r.text
        return str(r.json()["userId"])

    person = put("member")
    put("admin")  # a role change
    sets = [e for e in audit(d, action="member.set") if e["detail"]["userId"] == person]
    assert len(sets) == 2
    for e in sets:
        assert (e["actorUserId"], e["actorKeyId"], e["workspaceId"]) == (
            admin_id, admin_key_id, ws)  # fmt: skip

    r = d.call("POST", f"/api/v2/workspaces/{ws}/keys", d.admin_key,
               json={"kind": "personal", "email": email, "name": "theirs"})  # fmt: skip
    assert r.status_code == 201, r.text
    key_id, their_key = r.json()["key"]["keyId"], r.json()["apiKey"]
    made = next(e for e in audit(d, action="key.create") if e["detail"]["keyId"] == key_id)
    assert (made["actorUserId"], made["actorKeyId"], made["workspaceId"]) == (
        admin_id, admin_key_id, ws)  # fmt: skip
    assert made["detail"]["userId"] == person

    signed = d.call("POST", "/api/v2/session", json={"apiKey": their_key})
    assert signed.status_code == 200, signed.text
    ses = [e for e in audit(d, action="session.create") if e.get("actorKeyId") == key_id]
    assert len(ses) == 1 and ses[0]["workspaceId"] == ws and ses[0]["actorUserId"] == person

    r = d.call("DELETE", f"/api/v2/workspaces/{ws}/keys/{key_id}", d.admin_key)
    assert r.status_code == 200, r.text
    gone = next(e for e in audit(d, action="key.revoke") if e["detail"]["keyId"] == key_id)
    assert (gone["actorUserId"], gone["actorKeyId"], gone["workspaceId"]) == (
        admin_id, admin_key_id, ws)  # fmt: skip

    r = d.call("DELETE", f"/api/v2/workspaces/{ws}/members/{person}", d.admin_key)
    assert r.status_code == 200, r.text
    out = next(e for e in audit(d, action="member.remove") if e["detail"]["userId"] == person)
    assert (out["actorUserId"], out["actorKeyId"], out["workspaceId"]) == (
        admin_id, admin_key_id, ws)  # fmt: skip

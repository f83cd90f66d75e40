"""Egress grants: the app asks in its manifest, installing grants, an admin narrows; the
address rules of the proxy and the settings that open internal ranges. (The proxy itself,
end to end, is tests/test_egress_proxy.py.)"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import AppDir, run_cli, write_app
from daemon import Daemon, envelope
from runnerd.config import load_settings
from runnerd.egress import EgressError, covers, parse, parse_networks
from runnerd.errors import ConfigError
from runnerd.run.addresses import address_refusal

PY = "def run(i):\n    return {}\n"


def egress_app(root: Path, slug: str, egress: list[str], version: str) -> Path:
    write_app(root, slug, {"call": PY}, version=version)
    manifest = root / "agentserve.app.yaml"
    lines = "".join(f"  - '{e}'\n" for e in egress)
    manifest.write_text(manifest.read_text() + ("egress:\n" + lines if egress else ""))
    return root


# --- the manifest field -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "normal"),
    [
        ("api.stripe.com", "api.stripe.com"),
        ("API.Stripe.com:443", "api.stripe.com:443"),
        ("*.slack.com", "*.slack.com"),
        ("198.18.0.2:8080", "198.18.0.2:8080"),
        ("[2001:DB8::1]:8443", "[2001:db8::1]:8443"),
        ("2001:db8::1", "[2001:db8::1]"),
    ],
)
def test_destinations_have_one_normal_form(entry: str, normal: str) -> None:
    assert str(parse(entry)) == normal


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("https://api.stripe.com", "no scheme"),
        ("api.stripe.com/v1", "no scheme, path"),
        ("*.com", "two labels"),
        ("a.*.b.com", "only a leading"),
        ("bad_host.com", "not a host name"),
        ("x.com:0", "1 to 65535"),
        ("x.com:http", "1 to 65535"),
        ("[1.2.3.4]", "only an IPv6"),
    ],
)
def test_bad_destinations_say_why(entry: str, why: str) -> None:
    with pytest.raises(EgressError, match=why):
        parse(entry)


def test_a_grant_covers_only_what_it_names() -> None:
    assert covers(parse("*.slack.com"), parse("hooks.slack.com:443"))
    assert not covers(parse("*.slack.com"), parse("slack.com"))
    assert covers(parse("x.com"), parse("x.com:80"))
    assert not covers(parse("x.com:443"), parse("x.com"))  # that is 443 and 80
    assert not covers(parse("x.com"), parse("x.com:8443"))
    assert not covers(parse("198.18.0.2"), parse("198.18.0.3"))


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("224.0.0.251", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "IPv4-mapped"),
        ("::ffff:93.184.216.34", "IPv4-mapped"),
        ("fd00::1", "private"),
        ("fec0::1", "site-local"),
        ("2002:a00:1::", "6to4"),  # 6to4 of 10.0.0.1
        ("198.18.0.2", "private"),  # benchmarking range: only when allowed
        ("240.0.0.1", "private"),
    ],
)
def test_the_proxy_refuses_every_address_class_that_is_not_the_internet(
    address: str, why: str
) -> None:
    found = address_refusal(ipaddress.ip_address(address), ())
    assert found is not None and why in found


def test_public_addresses_and_allowed_networks_pass() -> None:
    allowed = parse_networks(["198.18.0.0/24", "10.20.0.0/16"])
    for address in ("93.184.216.34", "2606:2800:220:1::1", "198.18.0.2", "10.20.3.4"):
        assert address_refusal(ipaddress.ip_address(address), allowed) is None, address
    assert address_refusal(ipaddress.ip_address("10.21.0.1"), allowed) is not None


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("10.0.0.0/33", "not a network in CIDR form"),
        ("crm.internal", "not a network in CIDR form"),
        ("127.0.0.0/8", "overlaps 127.0.0.0/8"),
        ("0.0.0.0/0", "overlaps"),
        ("169.254.0.0/16", "overlaps 169.254.0.0/16"),
        ("::/0", "overlaps"),
    ],
)
def test_egress_allow_networks_refuses_what_egress_never_reaches(
    tmp_path: Path, entry: str, why: str
) -> None:
    config = tmp_path / "runnerd.toml"
    config.write_text(f"egress_allow_networks = [{json.dumps(entry)}]\n")
    with pytest.raises(ConfigError, match=f"egress_allow_networks: .*{why}"):
        load_settings(config_file=config, env={})


def test_egress_settings_from_the_config_file_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "runnerd.toml"
    config.write_text('egress_allow_networks = ["198.18.0.0/24"]\negress_max_mb = 8\n')
    settings = load_settings(config_file=config, env={})
    assert settings.egress_allow_networks == ("198.18.0.0/24",)
    assert settings.egress_max_mb == 8
    env = {"RUNNERD_EGRESS_ALLOW_NETWORKS": "198.18.0.0/24, 10.20.0.0/16"}
    assert load_settings(env=env).egress_allow_networks == ("198.18.0.0/24", "10.20.0.0/16")


@pytest.mark.smoke
def test_upload_refuses_bad_and_repeated_entries_with_their_line(tmp_path: Path) -> None:
    root = egress_app(
        tmp_path / "app", "calls", ["api.stripe.com", "ftp://x", "API.stripe.com"], "1"
    )
    proc = run_cli("app", "validate", str(root), "--json")
    assert proc.returncode == 1
    problems = json.loads(proc.stdout)["problems"]
    assert [(p["file"], p["line"]) for p in problems] == [
        ("agentserve.app.yaml", 7),  # slug, name, version, tools, egress:, then entries
        ("agentserve.app.yaml", 8),
    ]
    assert "no scheme" in problems[0]["message"]
    assert "listed twice" in problems[1]["message"]


def test_the_published_manifest_schema_has_the_field() -> None:
    schema = json.loads(Path("schemas/agentserve.app.schema.json").read_text())
    assert schema["properties"]["egress"]["maxItems"] == 100


# --- granting, through the daemon --------------------------------------------------------------


def _publish(daemon: Daemon, root: Path) -> dict[str, Any]:
    deployed = daemon.deploy(root)
    assert deployed.status_code == 201, deployed.text
    version: dict[str, Any] = deployed.json()["version"]
    daemon.call(
        "POST",
        f"/api/v2/apps/{version['appSlug']}/versions/{version['version']}/publish",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
    )
    return version


@pytest.mark.jail
def test_install_grants_the_versions_list_and_an_admin_narrows_it(
    daemon: Daemon, tmp_path: Path
) -> None:
    asked = ["api.stripe.com", "*.slack.com", "198.18.0.2:8080"]
    v1 = _publish(daemon, egress_app(tmp_path / "v1", "caller", asked, "1"))
    assert v1["egress"] == asked
    installed = daemon.call(
        "POST",
        "/api/v2/apps/installs",
        daemon.admin_key,
        params={"workspaceId": daemon.workspace_id},
        json={"appSlug": "caller", "version": "1"},
    ).json()
    assert installed["egress"] == asked
    iid = installed["installId"]
    path = f"/api/v2/apps/installs/{iid}/egress"
    assert daemon.call("GET", path, daemon.admin_key).json() == {
        "installId": iid,
        "requested": asked,
        "granted": asked,
    }

    narrowed = daemon.call(
        "PUT", path, daemon.admin_key, json={"egress": ["hooks.slack.com:443", "API.stripe.com"]}
    )
    assert narrowed.status_code == 200, narrowed.text
    assert narrowed.json()["granted"] == ["hooks.slack.com:443", "api.stripe.com"]
    widened = daemon.call("PUT", path, daemon.admin_key, json={"egress": ["evil.example.com"]})
    assert "evil.example.com" in envelope(widened, 400, "EGRESS_NOT_REQUESTED")["message"]
    bad = daemon.call("PUT", path, daemon.admin_key, json={"egress": ["http://x"]})
    envelope(bad, 400, "INVALID_EGRESS")
    member = daemon.person("egress-member@example.com", role="member")
    envelope(daemon.call("PUT", path, member, json={"egress": []}), 403)
    assert daemon.call("GET", path, member).json()["granted"] == [
        "hooks.slack.com:443",
        "api.stripe.com",
    ]

    # Switching grants the new version's list, whatever was narrowed before.
    _publish(daemon, egress_app(tmp_path / "v2", "caller", ["api.stripe.com"], "2"))
    switched = daemon.call(
        "POST", f"/api/v2/apps/installs/{iid}/switch", daemon.admin_key, json={"version": "2"}
    ).json()
    assert switched["egress"] == ["api.stripe.com"]

    audit = daemon.call(
        "GET", "/api/v2/audit", daemon.admin_key, params={"workspaceId": daemon.workspace_id}
    ).json()["data"]
    grants = [(e["action"], e["detail"].get("egress")) for e in audit if e.get("installId") == iid]
    assert ("app.install", asked) in grants
    assert ("install.egress", ["hooks.slack.com:443", "api.stripe.com"]) in grants
    assert ("app.switch", ["api.stripe.com"]) in grants


@pytest.mark.jail
def test_a_version_without_egress_grants_nothing_and_the_cli_says_so(
    daemon: Daemon, tmp_path: Path
) -> None:
    root = egress_app(tmp_path / "plain", "plain", [], "1")
    _publish(daemon, root)
    env = daemon.client_env()
    installed = run_cli("app", "install", "--app", "plain", "--version", "1", env=env)
    assert installed.returncode == 0, installed.stderr
    assert "egress granted: none" in installed.stdout
    shown = run_cli("app", "egress", "show", "--app", "plain", "--json", env=env)
    assert json.loads(shown.stdout)["granted"] == []
    widened = run_cli("app", "egress", "set", "--app", "plain", "api.stripe.com", env=env)
    assert widened.returncode == 1 and "EGRESS_NOT_REQUESTED" in widened.stderr


@pytest.mark.jail
def test_the_cli_shows_and_narrows_a_grant(daemon: Daemon, tmp_path: Path) -> None:
    root = egress_app(tmp_path / "crm", "crm", ["crm.internal:8443", "*.example.org"], "1")
    app = AppDir(root)
    assert app.root == root
    _publish(daemon, root)
    env = daemon.client_env()
    installed = run_cli("app", "install", "--app", "crm", "--version", "1", env=env)
    assert "egress granted: crm.internal:8443, *.example.org" in installed.stdout
    narrowed = run_cli("app", "egress", "set", "--app", "crm", "api.example.org", env=env)
    assert narrowed.returncode == 0, narrowed.stderr
    assert "granted to the install:   api.example.org" in narrowed.stdout
    shown = run_cli("app", "egress", "show", "--app", "crm", env=env)
    assert "requested by the version: crm.internal:8443, *.example.org" in shown.stdout

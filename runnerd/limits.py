"""Every fixed limit of runnerd in one place, each with the rule it comes from.

A limit is a number runnerd holds to that no operator sets: a size, a count, a cap, a
timeout. Each says what it bounds and where its value comes from: the seed's rules for
code tools (no prefix), a protocol or another program's rule (named), or runnerd's own
choice (``runnerd:``, with the reason or the measurement behind it). Values an operator
tunes live in config.Settings instead; tests/test_limits.py keeps numeric limits from
being defined anywhere else.
"""

from typing import Final

from runnerd.model import Language

KB: Final = 1024
MB: Final = 1024 * KB

# --- Files an app ships ---------------------------------------------------------------------

MANIFEST_NAME: Final = "agentserve.app.yaml"  # the app manifest, at the app's root
TOOL_SUFFIX: Final = ".tool.yaml"  # <name>.tool.yaml describes the tool <name>
MAX_TOOLS_PER_APP: Final = 50  # an app ships at most 50 tools
MAX_SOURCE_BYTES: Final = 512 * KB  # a tool's source file is at most 512 KB
MAX_SCHEMA_BYTES: Final = 32 * KB  # the input and the output schema are 32 KB each at most
MAX_PACKAGES: Final = 50  # a tool lists at most 50 packages
MAX_NAME_CHARS: Final = 40  # a tool name is at most 40 characters
MAX_DESCRIPTION_CHARS: Final = 1024  # a description is at most 1,024 characters
MIN_TIMEOUT_MS: Final = 1_000  # timeoutMs is 1,000 to 300,000, including the sandbox start
MAX_TIMEOUT_MS: Final = 300_000  # same row
DEFAULT_TIMEOUT_MS: Final = 30_000  # same row: "Defaults to 30,000"
DEFAULT_EFFECT: Final = "read"  # a tool reads unless its file says effect: write
# A tool file is a few KB of YAML; anything far larger is a mistake, not a tool.
MAX_TOOL_YAML_BYTES: Final = 256 * KB  # runnerd: two 32 KB schemas plus generous room
MAX_MANIFEST_BYTES: Final = 64 * KB  # runnerd: a manifest is a handful of lines
# runnerd: a bundle is the manifest plus what the globs name; far more files is a mistake.
MAX_BUNDLE_FILES: Final = 2_000
MAX_PATH_CHARS: Final = 1_024  # runnerd: a bundle file's path (a Linux path is 4,096 at most)
# runnerd: entries a folder walk looks at before it gives up (node_modules and such).
MAX_WALK_ENTRIES: Final = 100_000
MAX_EGRESS_ENTRIES: Final = 100  # runnerd: an app calls a handful of systems, not hundreds
# runnerd: one egress entry as written: a DNS name (253, RFC 1035), "*." and a ":port".
MAX_EGRESS_ENTRY_CHARS: Final = 260
MAX_NPM_NAME_CHARS: Final = 214  # npm: a package name is at most 214 characters
# runnerd: an app's pages (the manifest's ``pages`` folder, served on the apps origin):
# a built single-page app is a few files of a few hundred KB; a vendor bundle or an
# image may be a few MB. Larger is a mistake (or a data set), not a page.
MAX_PAGE_BYTES: Final = 5 * MB  # one page file
MAX_PAGES_BYTES: Final = 20 * MB  # every page file of a version together
MAX_PAGE_FILES: Final = 1_000  # page files of a version (within MAX_BUNDLE_FILES)
DEFAULT_PAGE_ENTRY: Final = "index.html"  # the page a frame opens when ``entry`` is absent
DEV_PAGES_TTL_S: Final = 3600  # runnerd: dev pages (runnerd app dev) held after the last PUT
# runnerd: `runnerd app dev` looks at the pages folder this often, and PUTs the pages again
# this often, changed or not (well within their time in the store).
DEV_POLL_S: Final = 0.3
DEV_REFRESH_S: Final = DEV_PAGES_TTL_S / 4
DEV_PAGES_MAX_BYTES: Final = 64 * MB  # runnerd: every person's dev pages the store holds

# Source extensions and the language each one is.
SOURCE_LANGUAGES: Final[dict[str, Language]] = {
    ".ts": "typescript",
    ".mts": "typescript",
    ".js": "javascript",
    ".mjs": "javascript",
    ".py": "python",
}

# --- A call and its run ---------------------------------------------------------------------

MAX_INPUT_BYTES: Final = 256 * KB  # a call's input is at most 256 KB
MAX_OUTPUT_BYTES: Final = 1 * MB  # a run's output is at most 1 MB
# runnerd: JSON nesting (inputs, outputs, request bodies) and YAML nesting (tool and app
# files). Decoders and validators recurse once per level; deeper is refused unread.
MAX_JSON_DEPTH: Final = 128
# runnerd: a run's error text (message and stack), after secrets are scrubbed from it.
MAX_ERROR_CHARS: Final = 8 * KB
# runnerd: a run's stdout and stderr kept (for builders: `tool test`); the rest is dropped.
MAX_LOG_BYTES: Final = 64 * KB
# runnerd: a call's body (POST .../run, or an MCP JSON-RPC message): the input as JSON,
# every byte of it escaped, and the rest of the envelope; far larger is refused unread
# (docs/API.md: "at most 516 KB").
MAX_CALL_BODY_BYTES: Final = 2 * MAX_INPUT_BYTES + 4 * KB
# MCP: a tools/call nests the input two levels down: {"params": {"arguments": input}}.
MAX_MCP_DEPTH: Final = MAX_JSON_DEPTH + 2
MAX_TIMEOUT_S: Final = MAX_TIMEOUT_MS // 1000  # the longest run, in seconds
# runnerd: the longest anyone waits for one call's answer (the HTTP and SDK clients' default
# timeout; the daemon waiting on a run another request started): the longest run, sandbox
# start included, plus 30 s for admission, the checks of input and output and the answer.
MAX_CALL_WAIT_S: Final = MAX_TIMEOUT_S + 30
MAX_IDEMPOTENCY_KEY_CHARS: Final = 255  # runnerd: a UUID or a client's own key, not a document
COMPILED_CACHE_TOOLS: Final = 1024  # runnerd: Python tools whose bytecode the daemon keeps

# --- Checks of inputs, outputs and schemas --------------------------------------------------

# runnerd: a check whose known bound of work (schema bytes x value bytes) is at most this
# runs on the event loop: a few milliseconds at worst, and less than a thread's round trip
# for the typical tool (a schema of 1 KB, a value of a few hundred bytes).
MAX_INLINE_CHECK_WORK: Final = 400_000
VALIDATOR_CACHE: Final = 2048  # runnerd: compiled schema validators kept (tool x input/output)
# runnerd: an input refusal names at most this many problems (details.problems), then
# "and N more"; the explaining pass stops counting at MAX_INPUT_PROBLEMS_COUNTED.
MAX_INPUT_PROBLEMS: Final = 20
MAX_INPUT_PROBLEMS_COUNTED: Final = 1000
# runnerd: RE2's memory budget for one compiled schema pattern; a larger program is refused.
MAX_PATTERN_MEMORY: Final = 8 * MB
# runnerd: RE2's memory budget for a run's scrubber, every spelling of every secret at once.
MAX_SCRUB_MEMORY: Final = 64 * MB

# --- Secrets --------------------------------------------------------------------------------

MAX_SECRET_BYTES: Final = 32 * KB  # runnerd: an API key or a certificate, not a file
# runnerd: a secret's name is an environment variable name: a word, not a sentence.
MAX_SECRET_NAME_CHARS: Final = 128
# runnerd: a shorter fragment of a secret would match ordinary text, so it is not scrubbed;
# for the same reason a secret value is at least this long.
MIN_SCRUB_CHARS: Final = 4
# runnerd: reversed and any-case copies of shorter values are common text.
MIN_FOLDED_CHARS: Final = 8

# --- Request bodies and sign-in on the HTTP API ---------------------------------------------

# RFC 5321 (a path is at most 256 octets with its angle brackets): an email address.
MAX_EMAIL_CHARS: Final = 254
# runnerd: an id runnerd gives out (ids.new_id: a prefix, "_" and 26 characters) or a name
# it gives (an audit action), as a path or query parameter; longer is no id of runnerd's.
MAX_ID_CHARS: Final = 64
# The app manifest's schema (schemas/agentserve.app.schema.json): an app's slug and a
# version string are at most 64 characters each.
MAX_SLUG_CHARS: Final = 64
MAX_VERSION_CHARS: Final = 64
# runnerd: a version diff's schema changes listed for one tool (api/version_diff.py); more
# is marked truncated: a person reads a few dozen, and the answer stays small.
MAX_DIFF_SCHEMA_CHANGES: Final = 100

# runnerd: a body of a few fields (sign-in, a member, a key, an install, a switch, a grant,
# a budget); far larger is refused unread.
MAX_SMALL_BODY_BYTES: Final = 16 * KB
# runnerd: a body carrying one secret value: twice the value, so that one whose every
# character is escaped in JSON still fits.
MAX_SECRET_BODY_BYTES: Final = 2 * MAX_SECRET_BYTES
# runnerd: a deploy's body: the largest legal bundle (its pages too), base64-encoded, and
# 1 MB for JSON.
MAX_DEPLOY_BODY_BYTES: Final = (
    MAX_MANIFEST_BYTES
    + MAX_TOOLS_PER_APP * (MAX_SOURCE_BYTES + MAX_TOOL_YAML_BYTES)
    + MAX_PAGES_BYTES
) * 4 // 3 + 1 * MB
# runnerd: the strings and brackets a deploy body may hold: a path and a content per file,
# for twice the files a bundle may hold (more than that is refused with the bundle's reason).
MAX_DEPLOY_BODY_TOKENS: Final = 2 * 2 * MAX_BUNDLE_FILES + 8
# runnerd: bodies larger than this are decoded in a worker thread, off the event loop: 64 KB
# of small objects takes ~1 ms to decode and ~3 ms to scan for repeated keys (measured).
DECODE_INLINE_BYTES: Final = 64 * KB
LOGIN_LINK_TTL_S: Final = 600  # runnerd: a sign-in link is good once, for 10 minutes
# runnerd (issue 26's contract): a frame token (api/frames.py) opens an app's pages for an
# hour; the Manage page asks for a new one each time it opens the app.
FRAME_TOKEN_TTL_S: Final = 3600
# runnerd: a frame token's length in a URL, far above a real one (~120 characters).
MAX_FRAME_TOKEN_CHARS: Final = 512
# runnerd: API keys the rate limiter tracks before it forgets those idle past
# RATE_LIMIT_IDLE_S (they would have refilled to their burst: 2 s at the default rate).
RATE_LIMIT_MAX_KEYS: Final = 100_000
RATE_LIMIT_IDLE_S: Final = 60
# runnerd: on PostgreSQL each node enforces its share of a key's limit (1/N, N the live
# nodes); it counts them this often, so a dead node's share comes back within its lease + 1 s.
RATE_SHARE_EVERY_S: Final = 1.0
# runnerd: a node's contact with the database is unbroken while its lease renewals (every
# third of node_lease_s) end less than half a lease apart; it closes another node's runs
# only after a whole lease of it (docs/SCALING.md), so after an outage the others renew.
NODE_CONTACT_GAP: Final = 0.5
# runnerd: the row of a node stopped this long ago (7 days), with no run left open, is
# removed when a node joins: every restart adds one.
NODE_ROW_RETENTION_S: Final = 7 * 86_400

# --- The HTTP port: slow and many connections -----------------------------------------------

# Request line + headers of one request (nginx: 4 x 8 KB buffers); past it, 431.
MAX_REQUEST_HEAD_BYTES: Final = 32 * KB
MAX_REQUEST_HEAD_FIELDS: Final = 100  # header fields of one request (Apache's LimitRequestFields)
CUT_LOG_EVERY_S: Final = 10.0  # runnerd: cut connections are logged as counts, at most this often
# runnerd: cut connections answered (408, 431, 503) a second; past that they are just closed.
CUT_ANSWERS_PER_S: Final = 100
# runnerd: an answer still going this long after its head is a stream (evictable at a cap).
STREAM_GRACE_S: Final = 3.0
# runnerd: the open-file limit the daemon raises its soft limit to (never past the hard
# limit): each HTTP connection, each jail, each egress connection and the store hold
# descriptors; 1024, a common default, ran out at 1,000 connections. Not higher: children
# (nsjail, node) inherit it, and some close every descriptor up to it.
OPEN_FILES: Final = 65_536
FILES_PER_JAIL: Final = 4  # a jail's pipes: stdin, logs, result and nsjail's log
FILES_PER_EGRESS_CONNECTION: Final = 2  # the tool's side and the destination's
SPARE_FILES: Final = 256  # runnerd: the store, listeners, logs, runtimes' probes
# asyncio accepts up to `backlog` connections at each wake of the port, and sets each one up
# before anything else runs: with 2,048, a flood of 1,500 connections held kept-alive
# /healthz answers up to 110-165 ms, with 64 up to 45-80 ms (measured). So asyncio gets
# the small batch, and the kernel's queue of connections not yet accepted is made long
# again after (the kernel caps it at net.core.somaxconn).
ACCEPT_BATCH: Final = 64
LISTEN_BACKLOG: Final = 2048
# runnerd: the bounds of the http_* settings (Settings holds the defaults): a client slower
# than an hour is no client, and a million connections is past what one host holds.
MAX_HTTP_TIMEOUT_S: Final = 3600
MAX_HTTP_CONNECTIONS: Final = 1_000_000

# --- MCP ------------------------------------------------------------------------------------

MCP_REVOCATION_CHECK_S: Final = 1.0  # runnerd: open sessions and streams vs. revoked keys
# The MCP SDK's own shared cap on open sessions (its DEFAULT_MAX_SESSIONS), the last guard
# behind the per-person and per-workspace caps (the mcp_sessions_* settings); their bound.
MAX_MCP_SESSIONS: Final = 10_000
# runnerd: a session's idle expiry at most a day: an idle session holds ~40 KB (issue 24:
# 9,880 sessions grew the daemon from 90 to 464 MB).
MAX_MCP_SESSION_IDLE_S: Final = 86_400
# runnerd: how long tools/list_changed may wait on one session's stream before it is dropped.
MCP_NOTIFY_TIMEOUT_S: Final = 2.0

# --- The daemon's start and stop ------------------------------------------------------------

WARM_START_WAIT_S: Final = 10  # runnerd: /readyz waits this long at start for warm jails
APPROVAL_EXPIRY_EVERY_S: Final = 5  # runnerd: approvals past their time expire this often
WEBHOOK_TRIES: Final = 5  # runnerd: a webhook delivery is tried 5 times (Stripe-like backoff)
WEBHOOK_TIMEOUT_S: Final = 10.0  # runnerd: one delivery attempt's answer, at most
WEBHOOK_MAX_PENDING: Final = 1_000  # runnerd: deliveries waiting at once; past it, dropped (logged)
MAX_WEBHOOK_URL_CHARS: Final = 2_048  # runnerd: a URL, not a document
# runnerd: at shutdown, how long approved runs still going (in tasks) are waited for.
APPROVED_RUNS_DRAIN_S: Final = 30

# --- The sandbox ----------------------------------------------------------------------------

STOP_GRACE_S: Final = 0.5  # runnerd: after SIGTERM, nsjail's time to clean up before SIGKILL
# runnerd: after nsjail's SIGKILL, how long its jail's processes are waited for.
LEFTOVER_WAIT_S: Final = 2.0
# runnerd: after its reply, how long a jail gets to exit by itself before it is stopped: the
# harness exits right after writing (p99 12 ms for Python, 30 ms for Node on a loaded
# 2-core host, measured).
REPLY_GRACE_S: Final = 0.1
# runnerd: a run's deadline timer firing this much late means the daemon itself was stalled
# (stopped, paused, starved) past it; then the tool gets its timeout again from then (a
# reply that came meanwhile waits in its pipe), and is billed at most its timeout.
LATE_TIMER_S: Final = 0.25
WARM_MAX_IDLE_S: Final = 120  # runnerd: a waiting jail older than this is replaced, not used
WARM_MAX_KINDS: Final = 16  # runnerd: kinds (language + package env) keeping waiting jails
# runnerd: a waiting jail that died younger than this is not replaced until its kind is
# called again (a kind whose jails cannot start would otherwise restart them in a loop)
WARM_MIN_LIFE_S: Final = 1.0
# runnerd: at shutdown, how long the ends of jails are waited for: the longest run, and 5 s.
SANDBOX_CLOSE_WAIT_S: Final = MAX_TIMEOUT_S + 5
REPLY_FRAME_BYTES: Final = 4 * KB  # runnerd: the reply's frame and fields around the output
EGRESS_SOCKET: Final = "/run/egress.sock"  # runnerd: where a jail with a grant sees the proxy
# --- Python templates (issue 27: run/templates.py, sandbox/template_py.py) -----------------
# runnerd: children of one template before it is recycled (re-exec'd): its children share
# its str hash secret and address-space layout, so this bounds how many calls do.
TEMPLATE_MAX_FORKS: Final = 2_000
TEMPLATE_MAX_AGE_S: Final = 900.0  # runnerd: age at which a template is recycled (same bound)
# runnerd: a template's start: the interpreter, the harness and the package set's imports
# (a heavy set such as numpy + pandas takes a second or two on a loaded 2-core host).
TEMPLATE_START_TIMEOUT_S: Final = 20.0
# runnerd: one fork: the template's answer and the child's sandbox set-up (~3 ms measured).
TEMPLATE_FORK_TIMEOUT_S: Final = 5.0
TEMPLATE_OPEN_FILES: Final = 4_096  # runnerd: the template's nofile (a pidfd per live child)
# runnerd: a SIGKILLed child's reaping, as its template reports it; also a template's stop.
TEMPLATE_STOP_WAIT_S: Final = 2.0
# runnerd: after a template failed to start or its child failed verification, its kind's
# calls go to a fresh nsjail this long before a template is tried again.
TEMPLATE_RETRY_S: Final = 30.0
TEMPLATE_MESSAGE_BYTES: Final = 4 * KB  # runnerd: one control message (a few short fields)
TEMPLATE_CHILD_KILLED: Final = 128 + 9  # nsjail's status for a jail it SIGKILLed; a child the same
# runnerd: entries of a package env walked for FIFOs, sockets and devices before a template
# mounts it (a large set such as torch has ~20,000 files).
TEMPLATE_ENV_MAX_ENTRIES: Final = 200_000
MAX_JAIL_LOG_BYTES: Final = 16 * KB  # runnerd: nsjail's own messages about one jail
HARNESS_COMPILE_TIMEOUT_S: Final = 60  # runnerd: compiling the Python harness, once at start

# --- Package environments (built in a jail with the network) --------------------------------

BUILD_TIMEOUT_S: Final = 900  # runnerd: a cold install of 50 packages over a slow link
# runnerd: past nsjail's own time limit, when runnerd kills the build (nsjail hung).
BUILD_KILL_SLACK_S: Final = 30
# runnerd: how long a build waits for the builders' uid (one build at a time per host):
# the longest other build.
BUILDER_UID_WAIT_S: Final = BUILD_TIMEOUT_S + BUILD_KILL_SLACK_S
BUILD_MEMORY_MB: Final = 2048  # runnerd: npm and pip resolving 50 packages, with room
BUILD_OPEN_FILES: Final = 4096  # runnerd: npm opens many files at once
BUILD_PIDS: Final = 512  # runnerd: npm's and pip's workers and install scripts' children
BUILD_TMP_BYTES: Final = 1024 * MB  # runnerd: source builds unpack and compile under /tmp

# --- Runtimes and the toolchain (probed and installed at start or first use) ----------------

LDD_TIMEOUT_S: Final = 60  # runnerd: ldd of a runtime's interpreter and its native modules
PYTHON_PROBE_TIMEOUT_S: Final = 20  # runnerd: a Python asked for its version and paths
NODE_PROBE_TIMEOUT_S: Final = 10  # runnerd: node --version
TOOLCHAIN_INSTALL_TIMEOUT_S: Final = 600  # runnerd: npm installing the pinned toolchain
JS_CHECK_TIMEOUT_S: Final = 120  # runnerd: the upload's JavaScript check of one bundle

# --- Egress: the proxy and its resolver -----------------------------------------------------

# runnerd: a request line and headers sent to the proxy; more is not a proxy request.
MAX_PROXY_HEAD_BYTES: Final = 16 * KB
PROXY_HEAD_TIMEOUT_S: Final = 10.0  # runnerd: to send them (or a ClientHello), once connected
PROXY_BACKLOG: Final = 8  # runnerd: connections the proxy's Unix socket queues
PROXY_CHUNK_BYTES: Final = 64 * KB  # runnerd: read at once while relaying a connection
# runnerd: a ClientHello with post-quantum key shares is ~2 KB; 16 times that is refused.
MAX_CLIENT_HELLO_BYTES: Final = 32 * KB
MAX_EGRESS_FIGURES: Final = 32  # runnerd: destinations recorded per run; the rest are "other"
# runnerd: a destination as a run's figures record it (the tool chooses the name): an
# egress entry (MAX_EGRESS_ENTRY_CHARS) and a port, with room.
MAX_DESTINATION_CHARS: Final = 300
# runnerd: how often open connections are checked against their install's grant.
GRANT_RECHECK_S: Final = 1.0
# runnerd: a name not resolved by then (queued or asking) does not resolve.
DNS_LOOKUP_TIMEOUT_S: Final = 5.0
DNS_TRY_TIMEOUT_S: Final = 1.0  # c-ares's first try per server; it waits longer on the next
DNS_TRIES: Final = 2  # per server: with DNS_TRY_TIMEOUT_S a silent server fails in ~2.5 s
# runnerd: lookups in flight per install (a run opens up to 64 connections), queued behind
# those (more are refused at once), and in flight over all installs (each holds a socket).
DNS_LOOKUPS_PER_INSTALL: Final = 8
DNS_WAITING_PER_INSTALL: Final = 32
MAX_DNS_LOOKUPS: Final = 512

# --- The store ------------------------------------------------------------------------------

# runnerd: worker threads (and so PostgreSQL connections) per node for store work, unless
# the database_connections setting says otherwise. A run
# needs two short transactions; 8 keep up with a 2-core node's jails with room for the
# API, and stay far below PostgreSQL's default of 100 connections for a dozen nodes.
DB_THREADS: Final = 8
# runnerd: the bound of the database_connections setting (PostgreSQL allows 100 by default).
MAX_DATABASE_CONNECTIONS: Final = 1000
SQLITE_BUSY_TIMEOUT_S: Final = 10  # runnerd: a store write waits this long for SQLite's lock
POSTGRES_CONNECT_TIMEOUT_S: Final = 5  # runnerd: after it, the database is unavailable
# runnerd: the bound on what a frozen or cut-off node can hold (docs/SCALING.md, *A node
# that freezes*), set on each of a node's PostgreSQL connections unless its role, its
# database or the URL's options set them. A write transaction idle this long (its node
# stopped between two statements) is ended by the server, which frees its locks; a store
# transaction's statements follow each other within milliseconds.
POSTGRES_IDLE_IN_TRANSACTION_S: Final = 3
# A statement waits this long for a lock (a keyed lock), then 503 DATABASE_UNAVAILABLE
# with Retry-After; more than the idle bound, so a frozen holder is cut before its waiters.
POSTGRES_LOCK_TIMEOUT_S: Final = 5
# One statement of the store runs at most this long, lock wait included (0: no bound, for
# `admin migrate` and `admin copy`, whose statements cover whole tables).
POSTGRES_STATEMENT_TIMEOUT_S: Final = 10
# TCP (libpq's keepalives and tcp_user_timeout, unless the URL sets them): a database host
# gone silent is found in keepalives_idle + interval x count s while a node waits for an
# answer (11 s), and data it sent unacknowledged fails the connection after 10 s.
POSTGRES_KEEPALIVES_IDLE_S: Final = 5
POSTGRES_KEEPALIVES_INTERVAL_S: Final = 2
POSTGRES_KEEPALIVES_COUNT: Final = 3
POSTGRES_TCP_USER_TIMEOUT_S: Final = 10
# runnerd: /readyz waits this long for the store's answer, then says not ready (503).
READY_STORE_TIMEOUT_S: Final = 2
BACKUP_BUSY_TIMEOUT_S: Final = 30  # runnerd: a backup waits this long for a live store's lock
BACKUP_STEP_PAGES: Final = 256  # runnerd: pages a backup copies before it lets writers in
COPY_BATCH_ROWS: Final = 500  # runnerd: rows `store copy` inserts at once
# runnerd: ids in one IN (...) list, well under SQLite's 999 bound parameters before 3.32.
IN_LIST_IDS: Final = 500

# --- Where the daemon listens and keeps its data, unless configured -------------------------

DEFAULT_HOST: Final = "127.0.0.1"  # runnerd: loopback only; other addresses are configured
DEFAULT_PORT: Final = 8686  # runnerd: its own, away from development servers' 8000 and 8080
MAX_PORT: Final = 65_535  # TCP: a port number is 16 bits (the apps origin's: apps_port)
DEFAULT_DATA_DIR: Final = "~/.local/share/runnerd"  # the XDG data home of the daemon's user

# --- Toolchain used at upload to compile TypeScript and read JS exports ---------------------

MIN_NODE_MAJOR: Final = 20  # runnerd runs JS/TS tools on Node 20 or newer
# Exact pins: the toolchain is installed from these and nothing else (no ranges).
TOOLCHAIN_PACKAGES: Final[dict[str, str]] = {
    "esbuild": "0.28.2",
    "es-module-lexer": "1.7.0",
    "cjs-module-lexer": "2.1.0",
}

# --- The Python app SDK ---------------------------------------------------------------------

# runnerd: the longest the SDK waits before a retry (of 429 and 503), whatever Retry-After says.
MAX_RETRY_WAIT_S: Final = 30.0
# runnerd: same-origin hops one request follows (a proxy's path rewrite, not a loop).
MAX_REDIRECTS: Final = 5
MAX_TYPE_DEPTH: Final = 32  # runnerd: schema levels turned into types; deeper is unknown/Any

# --- OAuth 2.1 for MCP clients (runnerd/oauth) --------------------------------------------

OAUTH_REQUEST_TTL_S: Final = 600  # runnerd: a client's request waits this long for consent
OAUTH_CODE_TTL_S: Final = 60  # runnerd: an authorization code is exchanged within this
OAUTH_FETCH_TIMEOUT_S: Final = 5.0  # runnerd: a client ID metadata document's fetch, in all
OAUTH_MAX_DOCUMENT_BYTES: Final = 16 * 1024  # runnerd: a metadata document's size
OAUTH_DOCUMENT_CACHE_S: Final = 300  # runnerd: a fetched metadata document is kept this long
OAUTH_MAX_FETCHES: Final = 8  # runnerd: metadata documents fetched at once, by this node
OAUTH_MAX_QUERY_BYTES: Final = 4096  # runnerd: an authorization request's query string
OAUTH_MAX_STATE_CHARS: Final = 1024  # runnerd: its state, kept with the request
OAUTH_MAX_REGISTRATION_BYTES: Final = 16 * 1024  # runnerd: a client registration's body
OAUTH_MAX_REDIRECT_URIS: Final = 10  # runnerd: the redirect URIs of one client
OAUTH_MAX_URI_CHARS: Final = 2000  # runnerd: one redirect URI (or client_uri, logo_uri...)
OAUTH_MAX_NAME_CHARS: Final = 200  # runnerd: a client's name, as the consent screen shows it
# runnerd: how often an MCP call sent to the Manage page (URL-mode elicitation) reads
# whether its approval was decided, on any node.
APPROVAL_POLL_S: Final = 0.5

# --- Package environments on every node (run/package_envs.py) ------------------------------

ENV_BUILDING_RETRY_S: Final = 5  # runnerd: Retry-After of ENV_NOT_READY while a build goes on
# runnerd: after a failed background build, calls are answered ENV_NOT_READY for this long
# before the node tries again (the registry is not asked again on every call).
ENV_FAILED_RETRY_S: Final = 30.0

# --- Results held by another node (govern/peers.py) ----------------------------------------

# runnerd: a node asking the node that ran a run for its result waits this long for the
# answer (connect included); past it the answer says OUTPUT_NODE_UNREACHABLE.
PEER_TIMEOUT_S: Final = 2.0
# runnerd: what a node reads of another's answer at most: a result's output and error as
# JSON (escaping may double the output; an error character is up to 4 bytes), and the rest.
MAX_PEER_ANSWER_BYTES: Final = 2 * MAX_OUTPUT_BYTES + 4 * MAX_ERROR_CHARS + KB
# runnerd: the requests for results a node remembers (their nonces, for twice the window)
# so that none is answered twice; past it the oldest are forgotten first.
MAX_PEER_NONCES: Final = 100_000
# runnerd: a node's signed request for a result is good this long after it was made, on
# the asked node's clock: wide enough for any skew nodes tolerate (+/- 60 s), short enough
# that a request seen on the wire is soon of no use.
PEER_TOKEN_WINDOW_S: Final = 300

# --- Deploy from Git (upload/git.py, api/git_webhook.py) -----------------------------------

# runnerd: what one file read out of a commit holds at most: no bundle file can be larger
# than the whole deploy body, and the walk reads no more than a limit and a byte of any file.
GIT_FILE_CAP_BYTES: Final = MAX_DEPLOY_BODY_BYTES + 1
GIT_TREE_CAP_BYTES: Final = 4 * MAX_DEPLOY_BODY_BYTES  # runnerd: the app folder at a commit
GIT_TIMEOUT_S: Final = 120.0  # runnerd: one git step (fetch, ls-tree, cat-file) at most
# runnerd: a push event's body: GitHub's carries up to 20 commits with their file lists.
MAX_PUSH_BODY_BYTES: Final = 4 * MB
PUSH_BODY_TIMEOUT_S: Final = 10.0  # runnerd: a signed push's whole body arrives within it (408)

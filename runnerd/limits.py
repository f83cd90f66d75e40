"""Every fixed limit of runnerd in one place, each with the rule it comes from.

These are the product's rules for code tools (the tool file's fields, the app's limits,
a call's limits); tunable values live in config.Settings instead.
"""

from typing import Final

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

# Source extensions and the language each one is.
SOURCE_LANGUAGES: Final[dict[str, str]] = {
    ".ts": "typescript",
    ".mts": "typescript",
    ".js": "javascript",
    ".mjs": "javascript",
    ".py": "python",
}

# --- Calls ---------------------------------------------------------------------------------

MAX_INPUT_BYTES: Final = 256 * KB  # a call's input is at most 256 KB
MAX_OUTPUT_BYTES: Final = 1 * MB  # a run's output is at most 1 MB
# runnerd: JSON nesting (inputs, outputs, request bodies) and YAML nesting (tool and app
# files). Decoders and validators recurse once per level; deeper is refused unread.
MAX_JSON_DEPTH: Final = 128
# runnerd: a run's error text (message and stack), after secrets are scrubbed from it.
MAX_ERROR_CHARS: Final = 8 * KB
# runnerd: a run's stdout and stderr kept (for builders: `tool test`); the rest is dropped.
MAX_LOG_BYTES: Final = 64 * KB

# --- The store ------------------------------------------------------------------------------

# runnerd: worker threads (and so PostgreSQL connections) per node for store work, unless
# the database_connections setting says otherwise. A run
# needs two short transactions; 8 keep up with a 2-core node's jails with room for the
# API, and stay far below PostgreSQL's default of 100 connections for a dozen nodes.
DB_THREADS: Final = 8

# --- Where the daemon listens and keeps its data, unless configured ---------------------------

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8686
DEFAULT_DATA_DIR: Final = "~/.local/share/runnerd"

# --- Toolchain used at upload to compile TypeScript and read JS exports -------------------

MIN_NODE_MAJOR: Final = 20  # runnerd runs JS/TS tools on Node 20 or newer
# Exact pins: the toolchain is installed from these and nothing else (no ranges).
TOOLCHAIN_PACKAGES: Final[dict[str, str]] = {
    "esbuild": "0.28.2",
    "es-module-lexer": "1.7.0",
    "cjs-module-lexer": "2.1.0",
}

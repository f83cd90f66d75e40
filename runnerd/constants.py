"""Every limit and default of runnerd in one place, each with where it comes from.

"seed 000" is the product document on code tools (shared/seeds/000_*.txt);
its field table and its *Limits* table are the source of the numbers below.
"""

from typing import Final

KB: Final = 1024
MB: Final = 1024 * KB

# --- Files an app ships (seed 000, *Files*, field table and *Limits*) ------------------

MANIFEST_NAME: Final = "agentserve.app.yaml"  # seed 000, *Files*
TOOL_SUFFIX: Final = ".tool.yaml"  # seed 000: "<name>.tool.yaml describes the tool"
MAX_TOOLS_PER_APP: Final = 50  # seed 000, Limits: "Tools per app 50"
MAX_SOURCE_BYTES: Final = 512 * KB  # seed 000, Limits: "Source file 512 KB"
MAX_SCHEMA_BYTES: Final = 32 * KB  # seed 000, Limits: "input or output schema 32 KB each"
MAX_PACKAGES: Final = 50  # seed 000, field table: packages "At most 50"
MAX_NAME_CHARS: Final = 40  # seed 000, field table: name "at most 40 characters"
MAX_DESCRIPTION_CHARS: Final = 1024  # seed 000, field table: description "up to 1,024"
MIN_TIMEOUT_MS: Final = 1_000  # seed 000, field table: timeoutMs "1,000 to 300,000"
MAX_TIMEOUT_MS: Final = 300_000  # same row
DEFAULT_TIMEOUT_MS: Final = 30_000  # same row: "Defaults to 30,000"
DEFAULT_EFFECT: Final = "read"  # seed 000, field table: effect "read (default)"
# A tool file is a few KB of YAML; anything far larger is a mistake, not a tool.
MAX_TOOL_YAML_BYTES: Final = 256 * KB  # runnerd: two 32 KB schemas plus generous room
MAX_MANIFEST_BYTES: Final = 64 * KB  # runnerd: a manifest is a handful of lines

# Source extensions and the language each one is (seed 000, *Files*).
SOURCE_LANGUAGES: Final[dict[str, str]] = {
    ".ts": "typescript",
    ".mts": "typescript",
    ".js": "javascript",
    ".mjs": "javascript",
    ".py": "python",
}

# --- Calls (seed 000, *Limits*) -----------------------------------------------------------

MAX_INPUT_BYTES: Final = 256 * KB  # seed 000, Limits: "Input of one call 256 KB"
MAX_OUTPUT_BYTES: Final = 1 * MB  # seed 000, Limits: "Output of one run 1 MB"
# runnerd: JSON nesting (inputs, outputs, request bodies) and YAML nesting (tool and app
# files). Decoders and validators recurse once per level; deeper is refused unread.
MAX_JSON_DEPTH: Final = 128
# runnerd: a run's error text (message and stack), after secrets are scrubbed from it.
MAX_ERROR_CHARS: Final = 8 * KB
# runnerd: a run's stdout and stderr kept (for builders: `tool test`); the rest is dropped.
MAX_LOG_BYTES: Final = 64 * KB

# --- Daemon defaults (shared/DESIGN.md, *Contract*) ---------------------------------------

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

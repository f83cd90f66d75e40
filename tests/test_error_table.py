"""The error table, runnerd/errors.py, and the tables of the docs say the same thing.

Every wire reason a doc's error table lists is one runnerd/errors.py defines (or an
envelope code of api/errors.py), with the same HTTP status; every reason a caller can
meet is in docs/API.md's table; the codes the two SDKs make up themselves (a redirect
refused, a daemon out of reach) are the rows of docs/SDK.md's table. No daemon: the
tests read the package, the SDK sources and the docs.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import mcp.types

from runnerd import errors
from runnerd.api.errors import CODES, code_for_status

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGE = ROOT / "runnerd"

# A wire reason as the docs write it: `INSTALL_NOT_FOUND`, or the lowercase ones clients
# already knew (`budget_exhausted`, the SDKs' `connection_failed`).
_REASON = re.compile(r"[A-Z][A-Z0-9_]+|[a-z]+(?:_[a-z]+)+")
_CELL = re.compile(r"(?<!\\)\|")  # a cell border; `\|` inside a cell is text


def _error_classes() -> list[type[errors.RunnerdError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.RunnerdError) and cls.__module__ == errors.__name__
    ]


def _reasons() -> dict[str, int]:
    """Every wire reason of runnerd/errors.py, with its HTTP status."""
    found: dict[str, int] = {}
    for cls in _error_classes():
        if isinstance(cls.reason, str):
            status = found.setdefault(cls.reason, cls.status)
            assert status == cls.status, f"{cls.reason} is {status} and {cls.status}"
    return found


def _section(doc: str, heading: str) -> str:
    text = (DOCS / doc).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start : end if end != -1 else None]


def _rows(text: str) -> list[list[str]]:
    """The body rows of every markdown table in ``text``, as stripped cells (the header
    row and the ``---`` row of each table left out)."""
    rows: list[list[str]] = []
    in_body = False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_body = False
        elif re.fullmatch(r"[|\s:-]+", line):
            in_body = True  # the --- row: the body rows follow
        elif in_body:
            rows.append([cell.strip() for cell in _CELL.split(line)[1:-1]])
    return rows


def _tokens(cell: str) -> set[str]:
    """The wire reasons a cell names: the backticked words that read as one."""
    return {t for t in re.findall(r"`([^`]+)`", cell) if _REASON.fullmatch(t)}


def _known(reason: str, status: int | None = None) -> bool:
    """Whether ``reason`` is a reason of errors.py or an envelope code (with ``status``)."""
    reasons = _reasons()
    if reason in reasons:
        return status is None or reasons[reason] == status
    if reason in CODES:
        return status is None or CODES[reason][0] == status
    return False


# --- the table itself -----------------------------------------------------------------------


def test_every_domain_error_is_defined_in_the_error_table() -> None:
    table = {cls.__name__ for cls in _error_classes()}
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & (table | {"RunnerdError"}):
                    elsewhere.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert elsewhere == [], "domain errors belong in runnerd/errors.py"


def test_every_error_says_why_with_a_status_and_a_reason_in_one_form() -> None:
    for cls in _error_classes():
        assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no one-line reason"
        assert 400 <= cls.status <= 599, cls.__name__
        if cls.reason is not None:
            assert _REASON.fullmatch(cls.reason), cls.__name__
    # a reason that is an envelope code is that code's status (it is not repeated in details)
    for reason, status in _reasons().items():
        if reason in CODES:
            assert CODES[reason][0] == status, reason


def test_errors_py_is_a_leaf() -> None:
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    imported = []
    for node in tree.body:  # module level: a TYPE_CHECKING block is for annotations only
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runnerd"):
            imported.append(node.module)
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names if a.name.startswith("runnerd")]
    assert set(imported) <= {"runnerd.limits"}


# --- docs/API.md ----------------------------------------------------------------------------


def _api_rows() -> list[tuple[int, str, set[str]]]:
    """docs/API.md's error table: (status, envelope code, the details.code reasons)."""
    rows = _rows(_section("API.md", "## Errors"))
    assert rows, "docs/API.md has no error table under ## Errors"
    return [(int(status), code.strip("`"), _tokens(reasons)) for status, code, reasons, *_ in rows]


def test_the_api_error_table_lists_only_reasons_the_code_has() -> None:
    wrong = []
    for status, code, reasons in _api_rows():
        if code != code_for_status(status):
            wrong.append(f"{status} is {code_for_status(status)}, not {code}")
        wrong += [f"{status} {r}" for r in sorted(reasons) if not _known(r, status)]
    assert wrong == [], "docs/API.md's error table names reasons or statuses runnerd has not"


def test_every_reason_a_caller_can_meet_is_in_the_api_error_table() -> None:
    rows = _api_rows()
    documented = {(status, r) for status, _, reasons in rows for r in reasons}
    codes = {(status, code) for status, code, _ in rows}
    missing = []
    for reason, status in sorted(_reasons().items()):
        if reason == code_for_status(status):  # no details.code: the envelope code says it
            found = (status, reason) in codes
        else:
            found = (status, reason) in documented
        if not found:
            missing.append(f"{status} {reason}")
    missing += [code for code, (status, _) in CODES.items() if (status, code) not in codes]
    assert missing == [], "add these to docs/API.md's error table"


# --- docs/MCP.md ----------------------------------------------------------------------------


def _names_used(paths: list[Path]) -> set[str]:
    return {
        node.id
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Name)
    }


def test_the_mcp_call_table_names_reasons_runnerd_has_and_every_mcp_only_refusal() -> None:
    calls = _rows(_section("MCP.md", "## Calls"))  # its table: each outcome of a call
    tokens = {t for row in calls for cell in row for t in _tokens(cell)}
    # JSON-RPC's own error names (INVALID_PARAMS...) are the MCP SDK's, not runnerd's.
    unknown = {
        t for t in tokens if not _known(t) and not isinstance(getattr(mcp.types, t, None), int)
    }
    assert unknown == set(), "docs/MCP.md's call table names reasons runnerd has not"
    # What only /mcp refuses is in that table: no other doc lists it.
    mcp_files = sorted((PACKAGE / "mcp").glob("*.py"))
    others = [p for p in PACKAGE.rglob("*.py") if p.parent.name != "mcp" and p.name != "errors.py"]
    only_mcp = (_names_used(mcp_files) - _names_used(others)) & {
        c.__name__ for c in _error_classes()
    }
    assert only_mcp, "the check found no refusal of /mcp's own"
    missing = {
        str(getattr(errors, name).reason)
        for name in only_mcp
        if getattr(errors, name).reason not in tokens
    }
    assert missing == set(), "add these /mcp refusals to docs/MCP.md's call table"


# --- docs/SDK.md ----------------------------------------------------------------------------


def _sdk_codes() -> set[tuple[str, str, str]]:
    """(code, reason, status) of each error the SDKs make up themselves rather than read
    from an envelope; status "3xx" for a redirect's own, "any" for an answer that is no
    envelope."""
    python = (PACKAGE / "sdk" / "__init__.py").read_text()
    js = (ROOT / "clients" / "js" / "index.js").read_text()
    found: set[tuple[str, str, str]] = set()
    for code, reason, status in re.findall(
        r'AppBridgeError\(\s*"([A-Z_]+)",\s*"(\w+)",\s*(\d+)', python
    ):
        found.add((code, reason, status))
    for code, reason, status in re.findall(
        r"code: '([A-Z_]+)',\s*reason: '(\w+)',\s*status: (\d+)", js
    ):
        found.add((code, reason, status))
    assert re.search(r'AppBridgeError\(\s*"REDIRECT_REFUSED", reason', python)
    assert "code: 'REDIRECT_REFUSED', reason," in js
    for reason in re.findall(r'_redirect_refused\(\s*response,\s*"([A-Z_]+)"', python):
        found.add(("REDIRECT_REFUSED", reason, "3xx"))
    for status, reason in re.findall(r"redirectRefused\((0|response\.status),\s*'([A-Z_]+)'", js):
        found.add(("REDIRECT_REFUSED", reason, "0" if status == "0" else "3xx"))
    # An answer with no envelope (a proxy's error page): code and reason INTERNAL_ERROR.
    if '"code": "INTERNAL_ERROR"' in python and "|| 'INTERNAL_ERROR'" in js:
        found.add(("INTERNAL_ERROR", "INTERNAL_ERROR", "any"))
    return found


def _sdk_rows() -> list[tuple[str, set[str], str]]:
    """docs/SDK.md's error table: (code, reasons, status as written: 403, 0, 3xx, any)."""
    rows = _rows(_section("SDK.md", "## Errors"))
    assert rows, "docs/SDK.md has no error table under ## Errors"
    return [
        (code.strip("`"), _tokens(reasons), status.removeprefix("the "))
        for code, reasons, status, *_ in rows
    ]


def test_the_sdk_error_table_names_server_reasons_with_their_status() -> None:
    wrong = []
    for code, reasons, status in _sdk_rows():
        if not status.isdigit() or int(status) == 0:
            continue  # the SDKs' own (next test)
        if code != code_for_status(int(status)):
            wrong.append(f"{code} is not {status}")
        wrong += [f"{status} {r}" for r in sorted(reasons) if not _known(r, int(status))]
    assert wrong == [], "docs/SDK.md's error table names reasons or statuses runnerd has not"


def test_the_sdks_own_codes_are_the_rows_of_the_sdk_error_table() -> None:
    own = _sdk_codes()
    assert {c for c, _, _ in own} >= {"UNAVAILABLE", "REDIRECT_REFUSED", "INTERNAL_ERROR"}
    documented = {
        (code, reason, status)
        for code, reasons, status in _sdk_rows()
        if not status.isdigit() or int(status) == 0
        for reason in reasons
    }
    assert documented == own, "docs/SDK.md's table and the SDKs' own codes differ"


# --- docs/OPERATIONS.md ---------------------------------------------------------------------


def test_the_operations_tables_name_reasons_runnerd_has() -> None:
    rows = _rows((DOCS / "OPERATIONS.md").read_text())
    named = set()
    for row in rows:
        line = " | ".join(row)
        named |= set(re.findall(r'reason="(\w+)"', line))
        if "`reason`" in line:  # the refusals counter's label values
            named |= {t for t in _tokens(line) if not t.startswith("runnerd_")}
    assert named, "docs/OPERATIONS.md names no refusal reason in its tables"
    assert {r for r in named if not _known(r)} == set()

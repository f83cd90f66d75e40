"""Every fixed limit lives in runnerd/limits.py, named once, with where it comes from.

An AST scan of the package: outside limits.py no module (nor a class in it) binds an
UPPER_CASE name to a number, a literal or arithmetic with one (``MAX_FOO = 10``,
``GRACE_S = 0.5``, ``CAP = 64 * 1024``, ``DEPTH = MAX_JSON_DEPTH + 2``), except the few
numbers below that are not limits. Settings defaults are fields of config.Settings
(lowercase), so they are not caught here: they stay where operators look for them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import runnerd
from runnerd import limits

PACKAGE = Path(runnerd.__file__).parent

# Numbers that are not limits: each is an identity, a protocol's value or a sentinel,
# so it stays beside the code that speaks that protocol.
NOT_LIMITS = {
    # A TLS extension type (RFC 6066: server_name is 0), not a bound.
    ("run/authority.py", "_EXT_SERVER_NAME"),
    # A sentinel of Request.body (a chunked body), not a size.
    ("run/authority.py", "CHUNKED"),
    # The uid and gid a tool sees inside its jail: an identity, mapped to the run's own.
    ("run/jail.py", "INSIDE_ID"),
    # The reply frame's "LENGTH\n" header is read from its first bytes: the frame's format.
    ("run/spawn.py", "_Reply.HEADER_MAX"),
    # The benchmark's workload (what is measured), not a bound runnerd holds to.
    ("cli/bench.py", "BURST"),
    ("cli/bench.py", "COLD_PAUSE_S"),
}


def _has_number(node: ast.expr) -> bool:
    """``node`` is a number, or arithmetic of names and numbers holding at least one."""

    def leaves(node: ast.expr) -> list[ast.expr] | None:
        if isinstance(node, ast.UnaryOp):
            return leaves(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = leaves(node.left), leaves(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.Constant | ast.Name | ast.Attribute):
            return [node]
        return None  # a call, a tuple, a string operation...: not a number

    found = leaves(node)
    if found is None:
        return False
    numbers = [n for n in found if isinstance(n, ast.Constant)]
    return bool(numbers) and all(
        isinstance(n.value, int | float) and not isinstance(n.value, bool) for n in numbers
    )


def _numeric_bindings(tree: ast.Module) -> list[tuple[str, int]]:
    """UPPER_CASE names bound to a number at module level or in a class body."""
    found: list[tuple[str, int]] = []

    def scan(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                scan(node.body, f"{prefix}{node.name}.")
                continue
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if not _has_number(value):
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id.lstrip("_").isupper():
                    found.append((prefix + target.id, node.lineno))

    scan(tree.body, "")
    return found


def _stray_limits() -> list[str]:
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == "limits.py":
            continue
        for name, line in _numeric_bindings(ast.parse(path.read_text(), str(path))):
            if (module, name) not in NOT_LIMITS:
                stray.append(f"runnerd/{module}:{line}: {name}")
    return stray


def test_no_module_but_limits_defines_a_numeric_limit() -> None:
    stray = _stray_limits()
    assert not stray, "move these limits to runnerd/limits.py (or say why not):\n" + "\n".join(
        stray
    )


def test_the_allow_list_names_only_constants_that_exist() -> None:
    """An entry whose constant is gone (moved, renamed) is dropped, not kept forever."""
    present = set()
    for path in PACKAGE.rglob("*.py"):
        module = path.relative_to(PACKAGE).as_posix()
        present |= {(module, name) for name, _ in _numeric_bindings(ast.parse(path.read_text()))}
    assert not NOT_LIMITS - present, sorted(NOT_LIMITS - present)


def test_the_scan_catches_a_limit_added_elsewhere() -> None:
    tree = ast.parse(
        "MAX_FOO = 10\n"
        "_GRACE_S: float = 0.5\n"
        "CAP = 64 * 1024\n"
        "DEPTH = MAX_JSON_DEPTH + 2\n"
        "class Pool:\n    SIZE = 8\n"
        "NAME = 'x'\nZEROS = '0' * 64\nPORTS = (443, 80)\nlowercase = 3\nDERIVED = OTHER\n"
        "FLAG = True\nCOUNT = len(NAMES) + 1\n"
    )
    assert [name for name, _ in _numeric_bindings(tree)] == [
        "MAX_FOO",
        "_GRACE_S",
        "CAP",
        "DEPTH",
        "Pool.SIZE",
    ]


def test_each_limit_says_where_it_comes_from() -> None:
    """Every limit in limits.py has a comment: on its line, or above it (one comment may
    speak for the run of limits right under it)."""
    lines = (PACKAGE / "limits.py").read_text().splitlines()
    silent = []
    for node in ast.parse("\n".join(lines)).body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        if node.target.id in ("KB", "MB"):  # the units
            continue
        at = node.lineno - 1
        while "#" not in lines[at] and at > 0 and lines[at - 1].strip():
            at -= 1  # up through the run of lines it belongs to
        comment = lines[at].lstrip()
        if "#" not in lines[at] or comment.startswith("# ---"):  # a section is no source
            silent.append(node.target.id)
    assert not silent, f"limits without a comment saying where they come from: {silent}"


def test_limits_that_depend_on_each_other_agree() -> None:
    """A secret value fits its body; a call's input fits its body; a client waits longer
    than the longest run."""
    assert limits.MAX_SMALL_BODY_BYTES < limits.MAX_SECRET_BODY_BYTES
    assert limits.MAX_SECRET_BODY_BYTES >= 2 * limits.MAX_SECRET_BYTES
    assert limits.MAX_CALL_BODY_BYTES >= 2 * limits.MAX_INPUT_BYTES
    assert limits.MAX_CALL_WAIT_S > limits.MAX_TIMEOUT_MS / 1000

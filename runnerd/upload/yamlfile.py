"""YAML for tool and app files: every position kept, nothing that can explode.

ruamel.yaml's round-trip loader keeps the line of every key and value (problems name
them). Three things of YAML are refused, each as a MarkedYAMLError with its line:

- anchors and aliases (``&a``/``*a``, and ``<<`` merges, which need them): nine aliases
  of nine aliases... expand a 500-byte file into gigabytes. Tool files have no use for
  them.
- nesting deeper than limits.MAX_JSON_DEPTH, in flow style (``[[[…``) refused by the
  scanner as it meets the bracket (its cost grows with the square of the flow depth),
  in block style by the composer (which recurses once per level).
- the size limits are checked on the raw bytes before any of this (bundle.py, tool_file.py).

The rest reads positions back: the line of a key or value, a YAML or schema error as a
problem at its line, and the tree as plain JSON-compatible values.
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer, ComposerError, MaxDepthExceededError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.scanner import RoundTripScanner, ScannerError

from runnerd.checks.schemas import FieldError
from runnerd.limits import MAX_JSON_DEPTH
from runnerd.model import Problem

__all__ = ["decode_text", "field_problems", "line_of", "load_yaml", "plain", "yaml_problem"]


class _Scanner(RoundTripScanner):
    def fetch_flow_collection_start(self, TokenClass: Any, to_push: str) -> None:
        if self.flow_level >= MAX_JSON_DEPTH:
            raise ScannerError(
                None,
                None,
                f"nested deeper than {MAX_JSON_DEPTH} levels, the limit",
                self.reader.get_mark(),
            )
        super().fetch_flow_collection_start(TokenClass, to_push)


class _Composer(Composer):
    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ComposerError(
                None,
                None,
                "anchors and aliases (&name, *name, <<) are not allowed in tool and app "
                "files: write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """``text`` as ruamel round-trip objects (CommentedMap/Seq with ``.lc`` positions).
    Raises a ruamel YAMLError (most are MarkedYAMLError with a line) for bad YAML,
    duplicate keys, anchors and aliases, and nesting past the limit."""
    yaml = YAML(typ="rt")
    yaml.Scanner = _Scanner
    yaml.Composer = _Composer
    yaml.allow_duplicate_keys = False
    yaml.max_depth = MAX_JSON_DEPTH
    try:
        return yaml.load(io.StringIO(text))
    except MaxDepthExceededError as exc:  # its own message tells to raise max_depth
        raise ComposerError(
            None, None, f"nested deeper than {MAX_JSON_DEPTH} levels, the limit", exc.problem_mark
        ) from None


def yaml_problem(file: str, exc: YAMLError) -> Problem:
    """``exc`` from load_yaml as a problem of ``file``, at its line when it has one."""
    if isinstance(exc, MarkedYAMLError) and exc.problem_mark is not None:
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        return Problem(file, f"invalid YAML: {what}", exc.problem_mark.line + 1)
    return Problem(file, f"invalid YAML: {exc}")


def line_of(node: Any, path: tuple[str | int, ...], on_key: bool = False) -> int:
    """1-based line of ``path`` in a ruamel round-trip tree (or of the closest parent)."""
    line = (node.lc.line + 1) if hasattr(node, "lc") else 1
    for depth, step in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, CommentedMap) and step in node:
            pos = node.lc.key(step) if (last and on_key) else node.lc.value(step)
            line = pos[0] + 1
            node = node[step]
        elif isinstance(node, CommentedSeq) and isinstance(step, int) and step < len(node):
            line = node.lc.item(step)[0] + 1
            node = node[step]
        else:
            break
    return line


def plain(node: Any) -> Any:
    """ruamel's round-trip objects as plain JSON-compatible Python values."""
    if isinstance(node, dict):
        return {str(k): plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return str(node)  # dates and other YAML scalars JSON has no type for


def field_problems(file: str, tree: Any, errors: list[FieldError]) -> list[Problem]:
    """Each of a schema check's ``errors`` of ``tree`` as a problem of ``file`` at its line."""
    return [Problem(file, e.message, line_of(tree, e.path, e.on_key)) for e in errors]


def decode_text(file: str, data: bytes, problems: list[Problem]) -> str | None:
    """``data`` as UTF-8 text, or None and a problem of ``file`` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(Problem(file, f"is not UTF-8 text (byte {exc.start})"))
        return None

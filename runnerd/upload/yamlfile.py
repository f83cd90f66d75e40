"""YAML for tool and app files: every position kept, nothing that can explode.

ruamel.yaml's round-trip loader keeps the line of every key and value (problems name
them). Three things of YAML are refused, each as a MarkedYAMLError with its line:

- anchors and aliases (``&a``/``*a``, and ``<<`` merges, which need them): nine aliases
  of nine aliases... expand a 500-byte file into gigabytes. Tool files have no use for
  them.
- nesting deeper than constants.MAX_JSON_DEPTH, in flow style (``[[[…``) refused by the
  scanner as it meets the bracket (its cost grows with the square of the flow depth),
  in block style by the composer (which recurses once per level).
- the size limits are checked on the raw bytes before any of this (bundle.py).
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer, ComposerError, MaxDepthExceededError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.scanner import RoundTripScanner, ScannerError

from runnerd.limits import MAX_JSON_DEPTH

__all__ = ["load_yaml"]


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

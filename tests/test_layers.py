"""The one-way dependency rule (docs/ARCHITECTURE.md): the import contracts in
pyproject.toml's ``[tool.importlinter]``, checked by import-linter's ``lint-imports``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# What the Manage page and MCP may take from runnerd.api: who asks, the envelope, how a
# body is read, the session cookie, the app state (the rest is the JSON API's own).
SHARED_API = {"__init__", "auth", "errors", "reading", "sessions", "state"}


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def test_imports_keep_the_layers_and_have_no_cycle() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    found = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stdout[found.stdout.find("Contracts") :] + found.stderr


def test_surfaces_are_kept_from_every_api_module_but_the_shared_ones() -> None:
    # A forbidden contract lists modules one by one: a new api module joins the list here.
    forbidden = set(_contracts()["surfaces-share-only-auth"]["forbidden_modules"])
    api_modules = {path.stem for path in (ROOT / "runnerd" / "api").glob("*.py")}
    assert forbidden == {f"runnerd.api.{name}" for name in api_modules - SHARED_API}

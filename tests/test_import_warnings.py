"""A Python tool that imports a module its jail will not have (not the standard
library, not a package it lists) is warned about at upload, with its file and line:
by ``runnerd app validate`` and by a deploy. A warning, not a refusal."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import AppDir, run_cli, tool_doc
from inproc import InProcess

SOURCE = textwrap.dedent(
    """\
    import json, os.path
    import yaml
    from dateutil import parser
    from PIL import Image
    try:
        import ujson
    except ImportError:
        ujson = None


    def run(input):
        import requests
        from bs4 import BeautifulSoup
        import helpers
        import requests.adapters
        return {}
    """
)
PACKAGES = ["PyYAML==6.0.2", "python-dateutil==2.9.0.post0", "pillow==11.0.0"]


def _app(root: Path, packages: list[str]) -> Path:
    app = AppDir(root)
    app.write("agentserve.app.yaml", "slug: imports\nname: Imports\ntools: ./tools/*\n")
    app.tool("fetch", yaml=tool_doc("fetch", packages=packages), source=SOURCE)
    app.write("tools/helpers.py", "X = 1\n")
    return root


def test_validate_warns_of_each_import_no_package_provides(tmp_path: Path) -> None:
    checked = run_cli("app", "validate", "--json", str(_app(tmp_path, PACKAGES)))
    assert checked.returncode == 0, checked.stderr  # warnings, not a refusal
    warnings = json.loads(checked.stdout)["warnings"]
    about = {w["message"].split("'")[1]: w for w in warnings if "imports" in w["message"]}
    # yaml, dateutil and PIL come from pyyaml, python-dateutil and pillow; json and os
    # are the standard library; ujson is optional (its ImportError is handled).
    assert sorted(about) == ["bs4", "helpers", "requests"]
    assert about["requests"]["file"] == "tools/fetch.py" and about["requests"]["line"] == 12
    assert about["bs4"]["line"] == 13
    assert "list the package that provides it" in about["requests"]["message"]
    assert "receives only the tool's own file" in about["helpers"]["message"]


def test_validate_prints_the_warning_with_file_and_line(tmp_path: Path) -> None:
    checked = run_cli("app", "validate", str(_app(tmp_path, PACKAGES)))
    assert checked.returncode == 0, checked.stderr
    assert "warning: tools/fetch.py:12: imports 'requests'" in checked.stdout + checked.stderr


def test_deploy_stores_the_version_and_answers_the_warnings(
    app_daemon: InProcess, tmp_path: Path
) -> None:
    answer = app_daemon.deploy(_app(tmp_path, []))  # no packages: no environment to build
    assert answer.status_code == 201, answer.text
    warned = {
        (w["file"], w.get("line"), w["message"].split("'")[1])
        for w in answer.json()["warnings"]
        if "imports" in w["message"]
    }
    assert warned == {
        ("tools/fetch.py", 2, "yaml"),
        ("tools/fetch.py", 3, "dateutil"),
        ("tools/fetch.py", 4, "PIL"),
        ("tools/fetch.py", 12, "requests"),
        ("tools/fetch.py", 13, "bs4"),
        ("tools/fetch.py", 14, "helpers"),
    }

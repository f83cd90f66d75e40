"""An input refusal names every problem of the input, each with its JSON pointer, up to
a bound (limits.MAX_INPUT_PROBLEMS), then how many more: for the API (the tool's check
and run routes) and MCP, which send the same envelope."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import write_app
from daemon import envelope
from inproc import InProcess
from runnerd.limits import MAX_INPUT_PROBLEMS

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deal-desk"
GOOD = {
    "discountPct": 12,
    "marginPct": 30,
    "termMonths": 24,
    "dealSize": 120000,
    "tier": "enterprise",
}
LINES = {
    "type": "object",
    "required": ["lines"],
    "properties": {
        "lines": {
            "type": "array",
            "items": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1}}},
        }
    },
}


@pytest.fixture(scope="module")
def installs(app_daemon: InProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    lines = write_app(
        tmp_path_factory.mktemp("lines"),
        "lines",
        {"count": "def run(input):\n    return {}\n"},
        docs={"count": {"input": LINES}},
    )
    return {
        "deal-desk": str(app_daemon.ship(EXAMPLE)["installId"]),
        "lines": str(app_daemon.ship(lines)["installId"]),
    }


def _check(app_daemon: InProcess, install: str, tool: str, value: object) -> dict[str, object]:
    path = f"/api/v2/apps/installs/{install}/tools/{tool}/check"
    answer = app_daemon.call("POST", path, app_daemon.admin_key, json={"input": value})
    return envelope(answer, 400, "INVALID_INPUT")


def test_a_refused_input_names_every_broken_field(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    bad = {**GOOD, "discountPct": 150, "marginPct": -200, "tier": "gold"}
    del bad["dealSize"]
    error = _check(app_daemon, installs["deal-desk"], "score_offer", bad)
    details = error["details"]
    assert isinstance(details, dict)
    problems = details["inputProblems"]
    assert {p["pointer"] for p in problems} == {"/discountPct", "/marginPct", "/tier", "/dealSize"}
    assert details["pointer"] == problems[0]["pointer"]  # the one field clients read today
    assert details["moreInputProblems"] == 0
    message = str(error["message"])
    assert message.startswith("input ")
    for problem in problems:
        assert problem["message"] in message
    assert "/dealSize is required" in message


def test_a_single_problem_reads_as_before(app_daemon: InProcess, installs: dict[str, str]) -> None:
    error = _check(app_daemon, installs["deal-desk"], "score_offer", {**GOOD, "discountPct": 150})
    assert error["message"] == "input /discountPct must be smaller than or equal to 100"
    assert error["details"] == {
        "code": "INVALID_INPUT",
        "pointer": "/discountPct",
        "inputProblems": [{"pointer": "/discountPct", "message": str(error["message"])[6:]}],
        "moreInputProblems": 0,
    }


def test_past_the_bound_the_refusal_says_how_many_more(
    app_daemon: InProcess, installs: dict[str, str]
) -> None:
    many = MAX_INPUT_PROBLEMS + 7
    error = _check(app_daemon, installs["lines"], "count", {"lines": [{"qty": 0}] * many})
    details = error["details"]
    assert isinstance(details, dict)
    assert [p["pointer"] for p in details["inputProblems"]] == [
        f"/lines/{i}/qty" for i in range(MAX_INPUT_PROBLEMS)
    ]
    assert details["moreInputProblems"] == 7
    assert str(error["message"]).endswith("; and 7 more")


def test_a_valid_input_still_passes(app_daemon: InProcess, installs: dict[str, str]) -> None:
    path = f"/api/v2/apps/installs/{installs['lines']}/tools/count/check"
    answer = app_daemon.call(
        "POST", path, app_daemon.admin_key, json={"input": {"lines": [{"qty": 1}] * 50}}
    )
    assert answer.json() == {"valid": True}

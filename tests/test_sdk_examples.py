"""The example app (examples/deal-desk) through the SDKs: its Python client scores an
offer, and the types `runnerd tools types` prints check its clients at compile time (tsc
and mypy). On one store only: nothing here depends on which."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from daemon import Daemon
from runnerd.run.runtimes import SYSTEM_CA, find_node, npm_cli

pytestmark = pytest.mark.jail

REPO = Path(__file__).resolve().parent.parent
JS_SDK = REPO / "clients" / "js"
EXAMPLE = REPO / "examples" / "deal-desk"
CLIENT = REPO / "examples" / "deal-desk" / "client"


@pytest.fixture(scope="module")
def deal_desk(daemon: Daemon) -> str:
    return str(daemon.ship(EXAMPLE)["installId"])


@pytest.mark.smoke
def test_the_example_app_scores_an_offer_through_the_python_sdk(
    daemon: Daemon, deal_desk: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(CLIENT / "quote.py")],
        env={**daemon.client_env(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("approve (89/100): "), done.stdout


@pytest.mark.network
def test_generated_types_check_the_example_app_at_compile_time(
    daemon: Daemon, deal_desk: str, tmp_path: Path
) -> None:
    """tsc --noEmit on quote.ts with the types `runnerd tools types --lang ts` printed; the
    same with a wrong input fails on that field. mypy does the same for quote.py."""
    app = tmp_path / "examples" / "deal-desk" / "client"
    shutil.copytree(CLIENT, app)
    shutil.copytree(JS_SDK, tmp_path / "clients" / "js", ignore=shutil.ignore_patterns("test"))
    env = daemon.client_env()
    for lang, target in (("ts", "runnerd-tools.ts"), ("py", "runnerd_tools.py")):
        made = run_cli("tools", "types", "--lang", lang, "--app", "deal-desk", env=env)
        assert made.returncode == 0, made.stderr
        (app / target).write_text(made.stdout)
    node = find_node()
    npm = npm_cli(node) if node else None
    assert node and npm, "the type check needs Node.js >= 20 and npm"
    installed = subprocess.run(
        [node.path, str(npm), "install", "--no-save", "--ignore-scripts", "--no-audit", "--no-fund",
         "typescript@5.9"],
        cwd=app, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NODE_EXTRA_CA_CERTS": SYSTEM_CA},
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    tsc = [node.path, str(app / "node_modules" / "typescript" / "bin" / "tsc"), "-p", str(app)]
    checked = subprocess.run(tsc, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    source = app / "quote.ts"
    source.write_text(source.read_text().replace("discountPct: 12,", "discountPct: '12',"))
    wrong = subprocess.run(tsc, capture_output=True, text=True, timeout=300)
    assert wrong.returncode != 0 and "quote.ts(30," in wrong.stdout, wrong.stdout
    assert "Type 'string' is not assignable to type 'number'" in wrong.stdout

    mypy = [sys.executable, "-m", "mypy", "--strict", str(app / "quote.py")]
    typed = subprocess.run(mypy, cwd=app, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "MYPYPATH": str(app)})  # fmt: skip
    assert typed.returncode == 0, typed.stdout
    script = app / "quote.py"
    script.write_text(script.read_text().replace('"discountPct": 12,', '"discountPct": "12",'))
    untyped = subprocess.run(mypy, cwd=app, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "MYPYPATH": str(app)})  # fmt: skip
    assert untyped.returncode != 0 and "discountPct" in untyped.stdout, untyped.stdout


# A usage of the generated client Protocols that mypy --strict passes, and one whose
# every marked line it must refuse: a wrong input, a tool name no tool has, an output key
# the tool has not, an output not checked for None, and a wrong input to the async client.
GOOD_USE = """
from __future__ import annotations

from runnerd.sdk import AppClient, AsyncAppClient, RunResult
from runnerd_tools import AsyncRunnerdClient, RunnerdClient, ScoreOfferInput

OFFER: ScoreOfferInput = {
    "discountPct": 12, "marginPct": 30, "termMonths": 24, "dealSize": 120000, "tier": "enterprise",
}


def decide(client: RunnerdClient) -> str:
    run = client.run_tool("score_offer", OFFER)
    routed = client.run_tool("deal-desk/route_ticket", {"subject": "x", "customer_tier": "free"})
    if run.output is None or routed.output is None:
        return run.error or ""
    score: int = run.output["score"]
    return f"{run.output['decision']} {score} {routed.output['queue']}"


def untyped(run: RunResult) -> object:  # a bare RunResult is RunResult[Any]
    return run.output


def bare(client: AppClient) -> object:  # an AppClient not annotated: Any, as before
    return client.run_tool("anything", {}).output["x"]


def main() -> None:
    client: RunnerdClient
    with AppClient("http://127.0.0.1:9", "k", "ws", app="deal-desk") as client:
        print(decide(client))


async def amain() -> None:
    client: AsyncRunnerdClient
    async with AsyncAppClient("http://127.0.0.1:9", "k", "ws", app="deal-desk") as client:
        run = await client.run_tool("score_offer", OFFER)
        print(run.output["reasons"] if run.output else None)
"""
BAD_USE = """
from __future__ import annotations

from runnerd.sdk import AppClient, AsyncAppClient
from runnerd_tools import AsyncRunnerdClient, RunnerdClient

client: RunnerdClient = AppClient("http://127.0.0.1:9", "k", "ws", app="deal-desk")
offer = {"discountPct": "12", "marginPct": 30, "termMonths": 24, "dealSize": 1, "tier": "standard"}
client.run_tool("score_offer", offer)  # BAD: discountPct is a number
client.run_tool("no_such_tool", {})  # BAD: no such tool
run = client.run_tool("route_ticket", {"subject": "x", "customer_tier": "free"})
print(run.output["score"] if run.output else None)  # BAD: route_ticket has no score
print(run.output["queue"])  # BAD: None unless the run succeeded


async def amain() -> None:
    other: AsyncRunnerdClient = AsyncAppClient("http://127.0.0.1:9", "k", "ws", app="deal-desk")
    await other.run_tool("score_offer", {"tier": "gold"})  # BAD: an input of another shape
"""


def test_generated_python_types_make_mypy_refuse_a_wrong_input_and_an_unknown_tool(
    daemon: Daemon, deal_desk: str, tmp_path: Path
) -> None:
    """`runnerd tools types --lang py --app deal-desk` prints TypedDicts and client
    Protocols with one `run_tool` overload per tool (its name a Literal): mypy --strict
    passes a right usage, sync and async, and refuses each wrong line of another."""
    made = run_cli("tools", "types", "--lang", "py", "--app", "deal-desk", env=daemon.client_env())
    assert made.returncode == 0, made.stderr
    assert "class RunnerdClient(Protocol):" in made.stdout and "@overload" in made.stdout
    (tmp_path / "runnerd_tools.py").write_text(made.stdout)
    (tmp_path / "good.py").write_text(GOOD_USE)
    (tmp_path / "bad.py").write_text(BAD_USE)

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", name],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
            env={**os.environ, "MYPYPATH": str(tmp_path), "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    good = mypy("good.py")
    assert good.returncode == 0, good.stdout
    bad = mypy("bad.py")
    refused = {int(line.split(":")[1]) for line in bad.stdout.splitlines() if ": error:" in line}
    marked = {n for n, line in enumerate(BAD_USE.splitlines(), 1) if "# BAD" in line}
    assert bad.returncode == 1 and refused == marked, bad.stdout
    assert 'No overload variant of "run_tool" of "RunnerdClient"' in bad.stdout
    assert 'TypedDict "RouteTicketOutput" has no key "score"' in bad.stdout
    # The module imports, and a real AppClient is the Protocol's at run time too.
    imported = subprocess.run(
        [sys.executable, "-c", "import runnerd_tools, good"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"},
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr


def test_generated_python_types_of_a_workspace_take_references_only(
    daemon: Daemon, deal_desk: str, tmp_path: Path
) -> None:
    """Without --app the Protocols take each tool's reference, not its bare name."""
    made = run_cli("tools", "types", "--lang", "py", env=daemon.client_env())
    assert made.returncode == 0, made.stderr
    (tmp_path / "runnerd_tools.py").write_text(made.stdout)
    (tmp_path / "use.py").write_text(
        "from runnerd.sdk import AppClient\n"
        "from runnerd_tools import DealDeskRouteTicketInput, RunnerdClient\n\n"
        'TICKET: DealDeskRouteTicketInput = {"subject": "x", "customer_tier": "free"}\n'
        'client: RunnerdClient = AppClient("http://127.0.0.1:9", "k", "ws")\n'
        'run = client.run_tool("deal-desk/route_ticket", TICKET)\n'
        'print(run.output["queue"] if run.output else None)\n'
        'client.run_tool("route_ticket", TICKET)\n'
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "use.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MYPYPATH": str(tmp_path), "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("use.py:8:"), checked.stdout

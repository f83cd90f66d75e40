"""The deal-desk example's two tools, unit-tested directly as plain functions.

route_ticket.py is imported and called; score_offer.ts is compiled by the same
toolchain an upload uses and called under Node. No sandbox, no workspace.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from conftest import EXAMPLE
from runnerd.checks.schemas import compile_schema
from runnerd.run.toolchain import Toolchain

TOOLS = EXAMPLE / "tools"


def output_validator(name: str) -> Any:
    doc = YAML(typ="safe").load((TOOLS / f"{name}.tool.yaml").read_text())
    return compile_schema(doc["output"])


# --- route_ticket ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def route_ticket() -> Any:
    spec = importlib.util.spec_from_file_location("route_ticket", TOOLS / "route_ticket.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run


@pytest.mark.parametrize(
    ("subject", "tier", "expected"),
    [
        ("Invoice #42 is wrong", "enterprise", {"queue": "billing", "priority": "high"}),
        ("Where is my INVOICE?", "free", {"queue": "billing", "priority": "normal"}),
        ("Login fails", "enterprise", {"queue": "support", "priority": "high"}),
        ("Login fails", "business", {"queue": "support", "priority": "normal"}),
    ],
)
def test_route_ticket(route_ticket: Any, subject: str, tier: str, expected: dict[str, str]) -> None:
    result = route_ticket({"subject": subject, "customer_tier": tier})
    assert result == expected
    output_validator("route_ticket")(result)


# --- score_offer ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def score_offer(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Any:
    source = (TOOLS / "score_offer.ts").read_text()
    [answer] = toolchain.check_sources(
        [{"path": "tools/score_offer.ts", "language": "typescript", "source": source}]
    )
    assert answer["errors"] == []
    module = tmp_path_factory.mktemp("score") / "score_offer.mjs"
    module.write_text(answer["code"])
    assert toolchain.node is not None
    node = toolchain.node.path

    def run(offers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        script = (
            f"import {{ run }} from {json.dumps(str(module))};\n"
            "const offers = JSON.parse(process.argv[1]);\n"
            "process.stdout.write(JSON.stringify(offers.map(run)));\n"
        )
        proc = subprocess.run(
            [node, "--input-type=module", "-e", script, json.dumps(offers)],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(module).parent,
        )
        results: list[dict[str, Any]] = json.loads(proc.stdout)
        return results

    return run


def offer(**kw: Any) -> dict[str, Any]:
    base = {
        "discountPct": 5,
        "marginPct": 35,
        "termMonths": 24,
        "dealSize": 100_000,
        "tier": "enterprise",
    }
    return {**base, **kw}


CASES = [
    # (offer, decision, score)
    (offer(tier="strategic", discountPct=20), "approve", 89),  # 20 of 27 allowed
    (offer(discountPct=18, termMonths=12), "review", 76),  # 3 over the 15% allowance
    (
        offer(tier="standard", discountPct=25, termMonths=12),
        "reject",
        15,
    ),  # 15 over: 100 - 40 - 3*15
    (offer(marginPct=15), "review", None),  # below the 20% minimum margin
    (offer(marginPct=5), "reject", None),  # below the 10% floor
    (offer(termMonths=6), "review", None),  # short term
    (offer(termMonths=72), "review", None),  # long term
    (offer(tier="standard", discountPct=6, termMonths=12, dealSize=5_000), "review", None),
    # small deal: half of 10% allowed
    (offer(discountPct=24, termMonths=36, dealSize=600_000), "approve", None),  # 25% allowed
]


def test_score_offer_applies_the_pricing_policy(score_offer: Any) -> None:
    results = score_offer([c[0] for c in CASES])
    validate = output_validator("score_offer")
    for (case, decision, score), result in zip(CASES, results, strict=True):
        validate(result)
        assert result["decision"] == decision, (case, result)
        if score is not None:
            assert result["score"] == score, (case, result)
        assert result["reasons"], result


def test_score_offer_discount_caps_by_tier(score_offer: Any) -> None:
    # At exactly the tier's cap (12-month term, mid-size deal) every tier is approved;
    # one point more needs review.
    caps = {"strategic": 25, "enterprise": 15, "standard": 10}
    at_cap = [offer(tier=t, discountPct=c, termMonths=12) for t, c in caps.items()]
    over = [offer(tier=t, discountPct=c + 1, termMonths=12) for t, c in caps.items()]
    assert [r["decision"] for r in score_offer(at_cap)] == ["approve"] * 3
    assert [r["decision"] for r in score_offer(over)] == ["review"] * 3


def test_score_offer_is_deterministic_and_bounded(score_offer: Any) -> None:
    offers = [offer(discountPct=d, marginPct=m) for d in (0, 50, 100) for m in (-100, 0, 100)]
    first, second = score_offer(offers), score_offer(offers)
    assert first == second
    assert all(0 <= r["score"] <= 100 and isinstance(r["score"], int) for r in first)

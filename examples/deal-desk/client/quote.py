"""An app that asks the deal desk whether to approve an offer, through the runnerd app SDK.

    RUNNERD_URL=… RUNNERD_API_KEY=… RUNNERD_WORKSPACE=… python quote.py

`runnerd tools types --lang py --app deal-desk > runnerd_tools.py` gives the TypedDicts
that mypy checks the input and output against.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from runnerd.sdk import AppBridgeError, AppClient

if TYPE_CHECKING:
    from runnerd_tools import ScoreOfferInput, ScoreOfferOutput


def quote(client: AppClient, offer: ScoreOfferInput) -> str:
    try:
        run = client.run_tool("score_offer", offer)
    except AppBridgeError as exc:
        if exc.reason == "budget_exhausted":
            return "the deal desk is out of budget this month"
        raise
    if run.status != "succeeded":
        return f"the deal desk could not score it: {run.error}"
    found = cast("ScoreOfferOutput", run.output)
    return f"{found['decision']} ({found['score']}/100): {'; '.join(found['reasons'])}"


if __name__ == "__main__":
    client = AppClient(
        os.environ.get("RUNNERD_URL", "http://127.0.0.1:8686"),
        os.environ["RUNNERD_API_KEY"],
        os.environ["RUNNERD_WORKSPACE"],
        app="deal-desk",
    )
    offer: ScoreOfferInput = {
        "discountPct": 12, "marginPct": 30, "termMonths": 24, "dealSize": 120000,
        "tier": "enterprise",
    }  # fmt: skip
    print(quote(client, offer))

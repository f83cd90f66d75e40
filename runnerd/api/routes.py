"""The route table: every operation of the API, from which the Starlette routes and the
OpenAPI document are both built, so the served API and its description cannot drift.
The table also serves its own description (``/api/v2/openapi.json``)."""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api import approvals as approvals_ops
from runnerd.api import apps as apps_ops
from runnerd.api import budgets as budgets_ops
from runnerd.api import dev_pages as dev_pages_ops
from runnerd.api import frames as frames_ops
from runnerd.api import git_webhook as git_ops
from runnerd.api import health as health_ops
from runnerd.api import ledger as ledger_ops
from runnerd.api import oauth as oauth_ops
from runnerd.api import people as people_ops
from runnerd.api import runs as runs_ops
from runnerd.api import secrets as secrets_ops
from runnerd.api import signin as signin_ops
from runnerd.api import tools as tools_ops
from runnerd.api import version_diff as version_diff_ops
from runnerd.api.openapi import openapi_document
from runnerd.api.ops import Op, json_response
from runnerd.api.state import AppState

__all__ = ["OPS", "api_document"]


async def openapi(request: Request, state: AppState) -> Response:
    return json_response(api_document())


OPS: list[Op] = [
    *tools_ops.OPS,
    *apps_ops.OPS,
    *version_diff_ops.OPS,
    *frames_ops.OPS,
    *dev_pages_ops.OPS,
    *secrets_ops.OPS,
    *budgets_ops.OPS,
    *runs_ops.OPS,
    *ledger_ops.OPS,
    *approvals_ops.OPS,
    *git_ops.OPS,
    *signin_ops.OPS,
    *oauth_ops.OPS,
    *people_ops.OPS,
    *health_ops.OPS,
    Op(
        "GET",
        "/api/v2/openapi.json",
        "openapi",
        "This API's OpenAPI document",
        openapi,
        None,
        errors=(500,),
        authenticated=False,
    ),
]


@functools.cache
def api_document() -> dict[str, Any]:
    """The OpenAPI document of OPS (built once)."""
    return openapi_document(OPS)

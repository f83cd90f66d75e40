"""An operation of the API (its method, path, handler, wire types and errors) and what
handlers read a request with: its JSON body, its query parameters.

The Starlette routes and the OpenAPI document are both built from one table of these
(runnerd/api/routes.py), so the served API and its description cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.errors import InvalidQuery
from runnerd.limits import MAX_ID_CHARS

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = [
    "INSTALL_ID",
    "WORKSPACE",
    "Op",
    "Param",
    "int_query",
    "json_response",
    "query_param",
]

Handler = Callable[[Request, "AppState"], Awaitable[Response]]


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    required: bool = False
    min_length: int = 1
    max_length: int = 128
    where: str = "query"  # query | path
    pattern: str | None = None  # a regex the value must match
    integer: tuple[int, int] | None = None  # (minimum, maximum) when the value is a number

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON Schema in the OpenAPI document."""
        if self.integer is not None:
            return {"type": "integer", "minimum": self.integer[0], "maximum": self.integer[1]}
        found: dict[str, Any] = {
            "type": "string",
            "minLength": self.min_length,
            "maxLength": self.max_length,
        }
        if self.pattern is not None:
            found["pattern"] = self.pattern
        return found


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    operation_id: str
    summary: str
    handler: Handler
    response: type | None
    status: int = 200
    body: type | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = (400, 401, 403, 404, 429, 500)
    authenticated: bool = True
    extra_responses: dict[int, type] = field(default_factory=dict)
    description: str = ""


def json_response(value: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json")


# The workspace a request acts in, on every operation that lists or changes its things.
WORKSPACE = Param(
    "workspaceId", "Workspace the request is authorized against.", required=True, max_length=128
)
# The install of the path, on every operation on one install.
INSTALL_ID = Param(
    "installId", "The install.", required=True, max_length=MAX_ID_CHARS, where="path"
)


def query_param(request: Request, param: Param) -> str | None:
    """The query parameter ``param`` names (None when absent and optional); 400
    INVALID_QUERY naming it when a required one is absent or its length is out of bounds."""
    value = request.query_params.get(param.name)
    if value is None:
        if param.required:
            raise InvalidQuery(param.name, f"{param.name} is required")
        return None
    if not param.min_length <= len(value) <= param.max_length:
        raise InvalidQuery(
            param.name,
            f"{param.name} must be {param.min_length} to {param.max_length} characters",
        )
    return value


def int_query(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter in [low, high]; 400 INVALID_QUERY naming it otherwise."""
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise InvalidQuery(name, f"{name} is a whole number from {low} to {high}")
    return int(text)

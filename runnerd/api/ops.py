"""The route table: each operation's method, path, handler, wire types and errors.

The Starlette routes and the OpenAPI document are both built from this one table, so
the served API and its description cannot drift apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.errors import ApiError
from runnerd.checks.nesting import nesting_over
from runnerd.constants import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = ["Op", "Param", "json_response", "read_body"]

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


# Bodies larger than this are decoded in a worker thread, off the event loop.
_DECODE_INLINE_BYTES = 256 * 1024


async def read_body(
    request: Request, kind: type[Any], limit: int, *, nesting_reason: str | None = None
) -> Any:
    """The request body decoded as ``kind``; 400 when too large, or not that shape.

    A ``kind`` with a free-form field (a run's input) passes ``nesting_reason``: the body
    is then refused unread, with that details.code, when it nests deeper than
    MAX_JSON_DEPTH inside its top-level object. Other kinds need no such check: decoding
    into a fixed shape stops at the first value of the wrong kind, before any depth; a
    part left unread (a msgspec.Raw) is refused when deeper than msgspec's own limit."""
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise ApiError(
                "BAD_REQUEST",
                f"request body is larger than {limit:,} bytes",
                details={"code": "BODY_TOO_LARGE"},
            )
    if len(data) <= _DECODE_INLINE_BYTES:
        return _decode(data, kind, nesting_reason)
    return await asyncio.to_thread(_decode, data, kind, nesting_reason)


def _decode(raw: bytearray, kind: type[Any], nesting_reason: str | None) -> Any:
    if nesting_reason is not None and nesting_over(raw, MAX_JSON_DEPTH + 1) is not None:
        what = "input" if nesting_reason == "INVALID_INPUT" else "request body"
        raise ApiError(
            "BAD_REQUEST",
            f"{what} is nested deeper than {MAX_JSON_DEPTH} levels, the limit",
            details={"code": nesting_reason},
        )
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiError(
            "BAD_REQUEST", f"invalid request body: {exc}", details={"code": "INVALID_BODY"}
        ) from None
    except msgspec.DecodeError as exc:
        raise ApiError(
            "BAD_REQUEST", f"request body is not JSON: {exc}", details={"code": "INVALID_BODY"}
        ) from None
    except RecursionError:  # a free-form part (a msgspec.Raw) deeper than msgspec goes
        raise ApiError(
            "BAD_REQUEST", "request body is nested too deeply", details={"code": "INVALID_BODY"}
        ) from None

"""The route table: each operation's method, path, handler, wire types and errors.

The Starlette routes and the OpenAPI document are both built from this one table, so
the served API and its description cannot drift apart.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.errors import ApiError
from runnerd.checks.duplicates import TooManyTokens, duplicate_key, duplicate_key_sparse
from runnerd.checks.nesting import nesting_over
from runnerd.limits import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from runnerd.api.state import AppState

__all__ = [
    "Op",
    "Param",
    "json_response",
    "read_body",
    "refuse_body",
    "refuse_repeated_keys",
    "require_json",
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


# Bodies larger than this are decoded in a worker thread, off the event loop: 64 KB of
# small objects takes ~1 ms to decode and ~3 ms to scan for repeated keys.
DECODE_INLINE_BYTES = 64 * 1024


# application/json in any case, and at most one parameter: charset=utf-8, quoted or not.
_JSON_TYPE = re.compile(r'[ \t]*application/json[ \t]*(?:;[ \t]*charset=(?:utf-8|"utf-8")[ \t]*)?',
                        re.IGNORECASE | re.ASCII)  # fmt: skip


def require_json(headers: Headers) -> None:
    """Refuse (415) a body not labelled ``application/json``: one Content-Type header,
    that type in any case, and no parameter but ``charset=utf-8`` (bodies are read as
    UTF-8, whatever a label says). A cross-site form can send only text/plain,
    application/x-www-form-urlencoded or multipart/form-data: no form gets past this."""
    sent = headers.getlist("content-type")
    if len(sent) != 1 or not _JSON_TYPE.fullmatch(sent[0]):
        got = "none" if not sent else ", ".join(repr(v[:100]) for v in sent)
        raise ApiError(
            "UNSUPPORTED_MEDIA_TYPE",
            "Content-Type must be application/json (a charset=utf-8 parameter may follow), "
            f"in one header; got {got}",
            details={"code": "CONTENT_TYPE_NOT_JSON", "field": "Content-Type"},
        )


async def refuse_body(request: Request) -> None:
    """Refuse (400) a body sent to an operation that takes none; an empty one, whatever
    its Content-Type, is fine. Stops reading at the first chunk that holds a byte."""
    async for chunk in request.stream():
        if chunk:
            raise ApiError(
                "BAD_REQUEST",
                f"{request.method} {request.url.path} takes no request body; send none",
                details={"code": "BODY_NOT_ALLOWED"},
            )


def refuse_repeated_keys(raw: bytes | bytearray, *, sparse_tokens: int | None = None) -> None:
    """Refuse (400) a JSON text with a key twice in one object, at any depth, compared as
    decoded. ``raw`` has been decoded (or depth-checked) already. ``sparse_tokens``:
    the text is a few long strings (a deploy), scanned without building them, and
    refused when it holds more strings and brackets than that."""
    try:
        if sparse_tokens is None:
            key = duplicate_key(raw)
        else:
            key = duplicate_key_sparse(raw, sparse_tokens)
    except TooManyTokens as exc:
        raise ApiError(
            "BAD_REQUEST", f"invalid request body: {exc}", details={"code": "INVALID_BODY"}
        ) from None
    if key is not None:
        shown = key if len(key) <= 64 else key[:64] + "…"
        raise ApiError(
            "BAD_REQUEST",
            f"request body holds the key {shown!r} twice in one object; send each key once",
            details={"code": "DUPLICATE_KEY", "key": shown},
        )


async def read_body(
    request: Request,
    kind: type[Any],
    limit: int,
    *,
    nesting_reason: str | None = None,
    sparse_tokens: int | None = None,
) -> Any:
    """The request body decoded as ``kind``; 415 unless it is labelled application/json,
    400 when too large, not that shape, or holding a key twice in one object.

    A ``kind`` with a free-form field (a run's input) passes ``nesting_reason``: the body
    is then refused unread, with that details.code, when it nests deeper than
    MAX_JSON_DEPTH inside its top-level object. Other kinds need no such check: decoding
    into a fixed shape stops at the first value of the wrong kind, before any depth; a
    part left unread (a msgspec.Raw) is refused when deeper than msgspec's own limit.
    ``sparse_tokens``: see ``refuse_repeated_keys``."""
    require_json(request.headers)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise ApiError(
                "BAD_REQUEST",
                f"request body is larger than {limit:,} bytes",
                details={"code": "BODY_TOO_LARGE"},
            )
    if len(data) <= DECODE_INLINE_BYTES:
        return _decode(data, kind, nesting_reason, sparse_tokens)
    return await asyncio.to_thread(_decode, data, kind, nesting_reason, sparse_tokens)


def _decode(
    raw: bytearray, kind: type[Any], nesting_reason: str | None, sparse_tokens: int | None
) -> Any:
    if nesting_reason is not None and nesting_over(raw, MAX_JSON_DEPTH + 1) is not None:
        what = "input" if nesting_reason == "INVALID_INPUT" else "request body"
        raise ApiError(
            "BAD_REQUEST",
            f"{what} is nested deeper than {MAX_JSON_DEPTH} levels, the limit",
            details={"code": nesting_reason},
        )
    try:
        decoded = msgspec.json.decode(raw, type=kind)
        # After decoding: msgspec refuses what is not JSON, or too deep, faster.
        refuse_repeated_keys(raw, sparse_tokens=sparse_tokens)
        return decoded
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

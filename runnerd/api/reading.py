"""What every surface reads a request body with: JSON only (415 otherwise), no key twice in
one object, nesting bounded before anything decodes, a size cap. The JSON API's handlers
(``read_body`` here) and MCP's endpoint (mcp/endpoint.py) share these rules.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request

from runnerd.checks.duplicates import TooManyTokens, duplicate_key, duplicate_key_sparse
from runnerd.checks.nesting import nesting_over
from runnerd.errors import (
    BodyNotAllowed,
    BodyTooLarge,
    ContentTypeNotJson,
    DuplicateKey,
    InvalidBody,
    InvalidInput,
)
from runnerd.limits import DECODE_INLINE_BYTES, MAX_JSON_DEPTH

__all__ = ["read_body", "refuse_body", "refuse_repeated_keys", "require_json"]


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
        raise ContentTypeNotJson(got)


async def refuse_body(request: Request) -> None:
    """Refuse (400) a body sent to an operation that takes none; an empty one, whatever
    its Content-Type, is fine. Stops reading at the first chunk that holds a byte."""
    async for chunk in request.stream():
        if chunk:
            raise BodyNotAllowed(
                f"{request.method} {request.url.path} takes no request body; send none"
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
        raise InvalidBody(f"invalid request body: {exc}") from None
    if key is not None:
        shown = key if len(key) <= 64 else key[:64] + "…"
        raise DuplicateKey(shown)


async def read_body(
    request: Request,
    kind: type[Any],
    limit: int,
    *,
    free_form: bool = False,
    sparse_tokens: int | None = None,
) -> Any:
    """The request body decoded as ``kind``; 415 unless it is labelled application/json,
    400 when too large, not that shape, or holding a key twice in one object.

    A ``kind`` with a free-form field (a run's input) passes ``free_form``: the body is
    then refused unread (INVALID_INPUT) when it nests deeper than MAX_JSON_DEPTH inside
    its top-level object. Other kinds need no such check: decoding
    into a fixed shape stops at the first value of the wrong kind, before any depth; a
    part left unread (a msgspec.Raw) is refused when deeper than msgspec's own limit.
    ``sparse_tokens``: see ``refuse_repeated_keys``."""
    require_json(request.headers)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise BodyTooLarge(limit)
    if len(data) <= DECODE_INLINE_BYTES:
        return _decode(data, kind, free_form, sparse_tokens)
    return await asyncio.to_thread(_decode, data, kind, free_form, sparse_tokens)


def _decode(raw: bytearray, kind: type[Any], free_form: bool, sparse_tokens: int | None) -> Any:
    if free_form and nesting_over(raw, MAX_JSON_DEPTH + 1) is not None:
        raise InvalidInput(f"input is nested deeper than {MAX_JSON_DEPTH} levels, the limit")
    try:
        decoded = msgspec.json.decode(raw, type=kind)
        # After decoding: msgspec refuses what is not JSON, or too deep, faster.
        refuse_repeated_keys(raw, sparse_tokens=sparse_tokens)
        return decoded
    except msgspec.ValidationError as exc:
        raise InvalidBody(f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidBody(f"request body is not JSON: {exc}") from None
    except RecursionError:  # a free-form part (a msgspec.Raw) deeper than msgspec goes
        raise InvalidBody("request body is nested too deeply") from None

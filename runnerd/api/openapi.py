"""The OpenAPI 3.1 document, generated from the op table and the wire types.

``runnerd openapi > schemas/openapi.json`` writes the checked-in copy; a test proves it
equals what the server serves.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runnerd import __version__
from runnerd.api.bodies import ErrorEnvelope
from runnerd.api.ops import Op

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"
_STATUS_TEXT = {
    200: "OK",
    201: "Created",
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    415: "Content-Type is not application/json",
    429: "Rate limited",
    500: "Internal error",
    503: "Service unavailable",
}


def openapi_document(ops: list[Op]) -> dict[str, Any]:
    """The OpenAPI document of ``ops`` (the route table, api/routes.py)."""
    types = {op.response for op in ops if op.response} | {op.body for op in ops if op.body}
    types |= {t for op in ops for t in op.extra_responses.values()}
    types.add(ErrorEnvelope)
    ordered = sorted(types, key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(ordered, ref_template=_REF)
    ref = dict(zip(ordered, schemas, strict=True))
    error = {"application/json": {"schema": ref[ErrorEnvelope]}}
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        operation: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "parameters": [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "description": p.description,
                    "schema": p.schema(),
                }
                for p in op.params
            ],
            "responses": {},
        }
        if op.description:
            operation["description"] = op.description
        if op.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref[op.body]}},
            }
        ok: dict[str, Any] = {"description": _STATUS_TEXT.get(op.status, "OK")}
        if op.response is not None:
            ok["content"] = {"application/json": {"schema": ref[op.response]}}
        else:
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        operation["responses"][str(op.status)] = ok
        for status, kind in op.extra_responses.items():
            operation["responses"][str(status)] = {
                "description": _STATUS_TEXT.get(status, "Accepted"),
                "content": {"application/json": {"schema": ref[kind]}},
            }
        # Every operation with a body refuses any other Content-Type (api/reading.py
        # require_json, called by every route daemon/app.py builds).
        statuses = (*op.errors, 415) if op.body is not None else op.errors
        for status in statuses:
            response: dict[str, Any] = {"description": _STATUS_TEXT[status], "content": error}
            if status in (429, 503):
                response["headers"] = {
                    "Retry-After": {
                        "description": "Seconds to wait before trying again",
                        "schema": {"type": "string"},
                    }
                }
            operation["responses"][str(status)] = response
        operation["security"] = [{"apiKey": []}] if op.authenticated else []
        paths.setdefault(op.path, {})[op.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "runnerd",
            "version": __version__,
            "description": "Self-hosted runner for code tools. Every error uses the "
            'envelope {"error": {"code", "message", "details"?}}.',
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}},
        },
    }

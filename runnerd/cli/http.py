"""A small HTTP client for the runnerd API (standard library only), used by the CLI."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from runnerd.errors import ApiFailure
from runnerd.limits import MAX_CALL_WAIT_S

__all__ = ["ApiClient"]


class ApiClient:
    def __init__(
        self, base_url: str, api_key: str | None, *, timeout: float = MAX_CALL_WAIT_S
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str | None] | None = None,
        body: Any = None,
    ) -> Any:
        url = self.base_url + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("X-API-Key", self.api_key)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                error = json.loads(payload)["error"]
            except (ValueError, KeyError, TypeError):
                raise ApiFailure(
                    exc.code, "HTTP_ERROR", payload.decode("utf-8", "replace") or exc.reason
                ) from None
            raise ApiFailure(
                exc.code, error.get("code", "ERROR"), error.get("message", ""), error.get("details")
            ) from None
        except urllib.error.URLError as exc:
            raise ApiFailure(
                0, "UNREACHABLE", f"cannot reach runnerd at {self.base_url}: {exc.reason}"
            ) from None

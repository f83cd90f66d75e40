"""The app SDK: call an app's code tools from Python.

    from runnerd.sdk import AppClient, AppBridgeError

    client = AppClient("http://127.0.0.1:8686", api_key, workspace_id, app="deal-desk")
    run = client.run_tool("score_offer", offer)      # or "deal-desk/score_offer"
    if run.status == "succeeded":
        print(run.output["decision"])

A run that started resolves, whatever its status (``succeeded``, ``failed``,
``timed_out``); every refusal before the tool starts raises ``AppBridgeError`` with the
envelope's ``code``, the precise ``reason`` (``details.code``: ``INVALID_INPUT``,
``budget_exhausted``, ``INSUFFICIENT_WORKSPACE_ROLE``...), the HTTP ``status``, the
``details`` and ``retry_after`` (seconds, for 429 and 503). ``AsyncAppClient`` is the
same for asyncio. This module needs only httpx: none of the daemon's parts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["AppBridgeError", "AppClient", "AsyncAppClient", "RunResult", "ToolInfo"]

RETRYABLE = (429, 503)
MAX_RETRY_WAIT_S = 30.0


class AppBridgeError(Exception):
    """A call refused before its tool started (or a daemon that cannot be reached:
    code ``UNAVAILABLE``, reason ``connection_failed``, status 0)."""

    def __init__(
        self,
        code: str,
        reason: str,
        status: int,
        message: str,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.status = status
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"AppBridgeError({self.code}, reason={self.reason!r}, status={self.status})"


@dataclass(frozen=True)
class RunResult:
    """A run that started: ``status`` is succeeded, failed or timed_out. A write call
    held for approval (from chat or relay surfaces) has status ``pending_approval``,
    ``run_id`` None and its ``approval_id``."""

    run_id: str | None
    status: str
    output: Any
    error: str | None
    duration_ms: int | None
    approval_id: str | None = None


@dataclass(frozen=True)
class ToolInfo:
    reference: str
    name: str
    description: str
    effect: str
    language: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    timeout_ms: int
    app_slug: str
    install_id: str
    version: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


def _tool(found: dict[str, Any]) -> ToolInfo:
    return ToolInfo(
        reference=found["reference"],
        name=found["name"],
        description=found["description"],
        effect=found["effect"],
        language=found["language"],
        input_schema=found["inputSchema"],
        output_schema=found["outputSchema"],
        timeout_ms=found["timeoutMs"],
        app_slug=found["appSlug"],
        install_id=found["installId"],
        version=found["version"],
        raw=found,
    )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _refusal(response: httpx.Response) -> AppBridgeError:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"code": "INTERNAL_ERROR", "message": response.text[:500] or response.reason_phrase}
    details = error.get("details") or {}
    code = str(error.get("code", "INTERNAL_ERROR"))
    return AppBridgeError(
        code=code,
        reason=str(details.get("code", code)),
        status=response.status_code,
        message=str(error.get("message", "")),
        details=details,
        retry_after=_retry_after(response),
    )


def _result(response: httpx.Response) -> RunResult:
    body = response.json()
    if response.status_code == 202:
        return RunResult(None, body["status"], None, None, None, approval_id=body["approvalId"])
    return RunResult(
        body["runId"], body["status"], body["output"], body["error"], body["durationMs"]
    )


class _Base:
    def __init__(
        self,
        url: str,
        api_key: str,
        workspace_id: str,
        app: str | None = None,
        *,
        retries: int = 0,
        timeout: float = 330.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.workspace_id = workspace_id
        self.app = app
        self.retries = retries  # opt-in: retries on 429 and 503, honouring Retry-After
        self.timeout = timeout

    def _run_request(
        self, name: str, value: Any, idempotency_key: str | None
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        app, _, tool = name.rpartition("/")
        app = app or self.app or ""
        if not app:
            raise ValueError(f"{name!r}: give the reference app/tool, or the client an app")
        path = f"/api/v2/apps/tools/{quote(app, safe='')}/{quote(tool, safe='')}/run"
        headers = {"X-API-Key": self.api_key}
        if idempotency_key is None and self.retries:
            idempotency_key = str(uuid.uuid4())  # a retry must not run the tool twice
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return path, {"input": value, "surface": "app"}, headers

    def _settle(self, response: httpx.Response, attempt: int) -> RunResult | float:
        """The run's result; else the seconds to wait before retrying (429 or 503 within
        the retries asked for); else AppBridgeError."""
        if response.status_code in (200, 202):
            return _result(response)
        if response.status_code not in RETRYABLE or attempt >= self.retries:
            raise _refusal(response)
        return min(_retry_after(response) or 2.0**attempt, MAX_RETRY_WAIT_S)

    def _tools(self, response: httpx.Response) -> list[ToolInfo]:
        if response.status_code != 200:
            raise _refusal(response)
        tools = [_tool(t) for t in response.json()["data"]]
        return [t for t in tools if self.app is None or t.app_slug == self.app]


def _unavailable(exc: httpx.HTTPError) -> AppBridgeError:
    return AppBridgeError(
        "UNAVAILABLE", "connection_failed", 0, f"cannot reach runnerd: {exc}", {}, None
    )


class AppClient(_Base):
    """Calls the tools of one workspace (and, with ``app``, one app) synchronously.

    The client keeps its connections between calls (a new HTTP client costs ~30 ms, ten
    times a call): make one and reuse it, from any thread; ``close()`` it when done, or
    use it as a context manager."""

    def __init__(
        self,
        url: str,
        api_key: str,
        workspace_id: str,
        app: str | None = None,
        *,
        retries: int = 0,
        timeout: float = 330.0,
    ) -> None:
        super().__init__(url, api_key, workspace_id, app, retries=retries, timeout=timeout)
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout)

    def __enter__(self) -> AppClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def run_tool(self, name: str, input: Any, idempotency_key: str | None = None) -> RunResult:
        path, body, headers = self._run_request(name, input, idempotency_key)
        attempt = 0
        while True:
            try:
                response = self._http.post(
                    path, json=body, headers=headers, params={"workspaceId": self.workspace_id}
                )
            except httpx.HTTPError as exc:
                raise _unavailable(exc) from exc
            settled = self._settle(response, attempt)
            if isinstance(settled, RunResult):
                return settled
            time.sleep(settled)
            attempt += 1

    def list_tools(self) -> list[ToolInfo]:
        try:
            response = self._http.get(
                "/api/v2/apps/tools",
                params={"workspaceId": self.workspace_id},
                headers={"X-API-Key": self.api_key},
            )
        except httpx.HTTPError as exc:
            raise _unavailable(exc) from exc
        return self._tools(response)


class AsyncAppClient(_Base):
    """The same calls for asyncio."""

    async def run_tool(
        self, name: str, input: Any, idempotency_key: str | None = None
    ) -> RunResult:
        path, body, headers = self._run_request(name, input, idempotency_key)
        attempt = 0
        async with httpx.AsyncClient(base_url=self.url, timeout=self.timeout) as http:
            while True:
                try:
                    response = await http.post(
                        path, json=body, headers=headers, params={"workspaceId": self.workspace_id}
                    )
                except httpx.HTTPError as exc:
                    raise _unavailable(exc) from exc
                settled = self._settle(response, attempt)
                if isinstance(settled, RunResult):
                    return settled
                await asyncio.sleep(settled)
                attempt += 1

    async def list_tools(self) -> list[ToolInfo]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as http:
                response = await http.get(
                    f"{self.url}/api/v2/apps/tools",
                    params={"workspaceId": self.workspace_id},
                    headers={"X-API-Key": self.api_key},
                )
        except httpx.HTTPError as exc:
            raise _unavailable(exc) from exc
        return self._tools(response)

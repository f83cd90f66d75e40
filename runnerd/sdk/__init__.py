"""The app SDK: call an app's code tools from Python.

    from runnerd.sdk import AppClient, AppBridgeError

    with AppClient("http://127.0.0.1:8686", api_key, workspace_id, app="deal-desk") as client:
        run = client.run_tool("score_offer", offer)      # or "deal-desk/score_offer"
        if run.status == "succeeded":
            print(run.output["decision"])

A run that started resolves, whatever its status (``succeeded``, ``failed``,
``timed_out``); every refusal before the tool starts raises ``AppBridgeError``. Its
``reason`` (and ``code``, always the same) is the precise reason to branch on: the
API's ``details.code`` (``INVALID_INPUT``, ``budget_exhausted``, ``TOOL_NOT_FOUND``,
``INSUFFICIENT_WORKSPACE_ROLE``...) or the SDK's own (``connection_failed``,
``CROSS_ORIGIN_REDIRECT``...); ``envelope_code`` is the envelope's class (``BAD_REQUEST``,
``FORBIDDEN``..., or the SDK's ``UNAVAILABLE``, ``REDIRECT_REFUSED``); with the HTTP
``status``, the ``details`` and ``retry_after`` (seconds, for 429 and 503).
``AsyncAppClient`` is the same for asyncio (``async with``). ``RunResult`` is generic in
its output: ``runnerd tools types --lang py`` prints a client Protocol whose ``run_tool``
overloads give each tool's input and output types. This module needs only httpx and
runnerd.limits (the numbers it shares with the daemon, such as how long a call may
take): none of the daemon's parts.

Neither client sends the API key or an input to another origin: a redirect is followed
only within the daemon's own origin (scheme, host and port), at most ``MAX_REDIRECTS``
hops; any other raises ``AppBridgeError`` (code ``REDIRECT_REFUSED``) before anything is
sent to its target.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic
from urllib.parse import quote

import httpx

from runnerd.limits import MAX_CALL_WAIT_S, MAX_REDIRECTS, MAX_RETRY_WAIT_S

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    from typing_extensions import TypeVar

    # A bare ``RunResult`` is ``RunResult[Any]`` (PEP 696), so annotations written before
    # it was generic still pass ``mypy --strict``; typing_extensions only for the checker.
    Output = TypeVar("Output", default=Any)
else:
    from typing import TypeVar

    Output = TypeVar("Output")

__all__ = ["AppBridgeError", "AppClient", "AsyncAppClient", "RunResult", "ToolInfo"]

RETRYABLE = (429, 503)
_REDIRECTS = (301, 302, 303, 307, 308)  # the statuses httpx and fetch treat as redirects
_DEFAULT_PORTS = {"http": 80, "https": 443}


class AppBridgeError(Exception):
    """A call refused before its tool started (or a daemon that cannot be reached:
    reason ``connection_failed``, envelope_code ``UNAVAILABLE``, status 0).

    ``reason`` is the field to branch on (``code`` is the same, always, as in the JS
    SDK and in a frame): the precise reason, ``budget_exhausted``, ``INVALID_INPUT``,
    ``TOOL_NOT_FOUND``... ``envelope_code`` is the API envelope's ``error.code``
    (``FORBIDDEN`` for a spent budget), one class of many reasons."""

    def __init__(
        self,
        envelope_code: str,
        reason: str,
        status: int,
        message: str,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.envelope_code = envelope_code
        self.reason = reason
        self.status = status
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after

    @property
    def code(self) -> str:
        """The precise reason: the same as ``reason``."""
        return self.reason

    def __repr__(self) -> str:
        return (
            f"AppBridgeError({self.reason!r}, envelope_code={self.envelope_code!r}, "
            f"status={self.status})"
        )


@dataclass(frozen=True)
class RunResult(Generic[Output]):
    """A run that started: ``status`` is succeeded, failed or timed_out. A write call
    held for approval (from chat or relay surfaces) has status ``pending_approval``,
    ``run_id`` None and its ``approval_id``. ``output`` is None unless succeeded: its
    type is ``Any``, or, through the generated client Protocol, the tool's output type
    or None (``RunResult[ScoreOfferOutput | None]``)."""

    run_id: str | None
    status: str
    output: Output
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
        envelope_code=code,
        reason=str(details.get("code", code)),
        status=response.status_code,
        message=str(error.get("message", "")),
        details=details,
        retry_after=_retry_after(response),
    )


def _result(response: httpx.Response) -> RunResult[Any]:
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
        timeout: float = MAX_CALL_WAIT_S,
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
        # No surface: the server records the one the key proves (api for a personal key).
        return path, {"input": value}, headers

    def _settle(self, response: httpx.Response, attempt: int) -> RunResult[Any] | float:
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


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """The origin ``url`` connects to: scheme, host as sent (IDNA, lower case; a trailing
    dot kept, since DNS reads ``name.`` without search domains), port with its default."""
    host = url.raw_host.decode("ascii").lower()
    return url.scheme, host, url.port or _DEFAULT_PORTS.get(url.scheme)


def _shown(origin: tuple[str, str, int | None]) -> str:
    scheme, host, port = origin
    if not host:
        return f"{scheme}:"  # data:, javascript:, file:... have no host to name
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


def _redirect_refused(
    response: httpx.Response, reason: str, message: str, **details: Any
) -> AppBridgeError:
    return AppBridgeError(
        "REDIRECT_REFUSED", reason, response.status_code, message, {"code": reason, **details}
    )


def _target(response: httpx.Response) -> httpx.URL | None:
    """Where a redirect points, resolved against its request, when that is the request's
    own origin (so, hop by hop, the client's); None when ``response`` is no redirect.

    Raises AppBridgeError (code ``REDIRECT_REFUSED``) for a target of another origin
    (``CROSS_ORIGIN_REDIRECT``, naming that origin, never the key or the target's path)
    or a Location that is no URL (``BAD_REDIRECT``). Sends nothing. It is also the
    clients' httpx response hook: httpx builds a redirect's next request even when it
    follows none, and a hostile Location would raise from inside httpx first."""
    location = response.headers.get("location")
    if response.status_code not in _REDIRECTS or location is None:
        return None
    try:
        # An http(s) Location with no host (http: and then backslashes): URL parsers
        # disagree on it (WHATWG reads another host, httpx a path), so it is not followed.
        alone = httpx.URL(location)
        if alone.scheme in _DEFAULT_PORTS and not alone.host:
            raise httpx.InvalidURL("a scheme without a host")
        target = response.request.url.join(location)
        origin = _origin(target)
    except (httpx.InvalidURL, UnicodeError):
        message = f"a redirect ({response.status_code}) to a Location that is no URL"
        raise _redirect_refused(response, "BAD_REDIRECT", f"{message}; not followed") from None
    here = _origin(response.request.url)
    if origin != here or target.scheme not in _DEFAULT_PORTS:
        shown = _shown(origin)[:200]
        message = (
            f"{_shown(here)} redirected ({response.status_code}) to another origin, {shown}; "
            "not followed: the API key and the input were not sent there"
        )
        raise _redirect_refused(response, "CROSS_ORIGIN_REDIRECT", message, origin=shown)
    return target


async def _target_async(response: httpx.Response) -> None:
    _target(response)


def _next_hop(response: httpx.Response, hops: int) -> httpx.Request | None:
    """The request a same-origin redirect asks for, with the same method, headers and
    body (307 and 308; 301, 302 and 303 of a GET); None when ``response`` is no redirect.

    Raises AppBridgeError (code ``REDIRECT_REFUSED``) as ``_target`` does, and for a 301,
    302 or 303 of a POST, which would drop the input (``REDIRECT_CHANGES_METHOD``), or a
    hop past MAX_REDIRECTS (``TOO_MANY_REDIRECTS``). Sends nothing: the caller sends the
    request returned, so the URL checked is the URL connected to."""
    target = _target(response)
    if target is None:
        return None
    request = response.request
    if request.method != "GET" and response.status_code in (301, 302, 303):
        message = (
            f"a redirect ({response.status_code}) would turn the {request.method} into a GET "
            "without its input; not followed (307 and 308 keep them)"
        )
        raise _redirect_refused(response, "REDIRECT_CHANGES_METHOD", message)
    if hops >= MAX_REDIRECTS:
        message = f"more than {MAX_REDIRECTS} redirects; not followed"
        raise _redirect_refused(response, "TOO_MANY_REDIRECTS", message, hops=hops)
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "host"]
    # The same headers and body; the extensions carry the timeout.
    return httpx.Request(
        request.method,
        target,
        headers=headers,
        content=request.content,
        extensions=request.extensions,
    )


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
        timeout: float = MAX_CALL_WAIT_S,
    ) -> None:
        super().__init__(url, api_key, workspace_id, app, retries=retries, timeout=timeout)
        # Redirects are followed by _send alone, which checks each target's origin first.
        self._http = httpx.Client(
            base_url=self.url,
            timeout=self.timeout,
            follow_redirects=False,
            event_hooks={"response": [_target]},
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, request: httpx.Request) -> httpx.Response:
        """``request``'s answer, after the same-origin redirects ``_next_hop`` allows."""
        hops = 0
        while True:
            try:
                response = self._http.send(request)
            except httpx.HTTPError as exc:
                raise _unavailable(exc) from exc
            following = _next_hop(response, hops)
            if following is None:
                return response
            request, hops = following, hops + 1

    def run_tool(self, name: str, input: Any, idempotency_key: str | None = None) -> RunResult[Any]:
        path, body, headers = self._run_request(name, input, idempotency_key)
        params = {"workspaceId": self.workspace_id}
        attempt = 0
        while True:
            request = self._http.build_request(
                "POST", path, json=body, headers=headers, params=params
            )
            settled = self._settle(self._send(request), attempt)
            if isinstance(settled, RunResult):
                return settled
            time.sleep(settled)
            attempt += 1

    def list_tools(self) -> list[ToolInfo]:
        request = self._http.build_request(
            "GET",
            "/api/v2/apps/tools",
            params={"workspaceId": self.workspace_id},
            headers={"X-API-Key": self.api_key},
        )
        return self._tools(self._send(request))


async def _send_async(http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """``request``'s answer, after the same-origin redirects ``_next_hop`` allows."""
    hops = 0
    while True:
        try:
            response = await http.send(request)
        except httpx.HTTPError as exc:
            raise _unavailable(exc) from exc
        following = _next_hop(response, hops)
        if following is None:
            return response
        request, hops = following, hops + 1


class AsyncAppClient(_Base):
    """The same calls for asyncio. Inside ``async with AsyncAppClient(...) as client:``
    the calls share one HTTP client and its connections (closed at the block's end, or
    by ``aclose()``); outside one, each call opens and closes its own."""

    def __init__(
        self,
        url: str,
        api_key: str,
        workspace_id: str,
        app: str | None = None,
        *,
        retries: int = 0,
        timeout: float = MAX_CALL_WAIT_S,
    ) -> None:
        super().__init__(url, api_key, workspace_id, app, retries=retries, timeout=timeout)
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Self:
        if self._http is None:
            self._http = self._client()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections ``async with`` opened; calls made after open their own."""
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def _client(self) -> httpx.AsyncClient:
        # Redirects are followed by _send_async alone, which checks each target's origin.
        return httpx.AsyncClient(
            base_url=self.url,
            timeout=self.timeout,
            follow_redirects=False,
            event_hooks={"response": [_target_async]},
        )

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[httpx.AsyncClient]:
        """The ``async with`` block's HTTP client, else one for this call alone."""
        if self._http is not None:
            yield self._http
            return
        async with self._client() as http:
            yield http

    async def run_tool(
        self, name: str, input: Any, idempotency_key: str | None = None
    ) -> RunResult[Any]:
        path, body, headers = self._run_request(name, input, idempotency_key)
        params = {"workspaceId": self.workspace_id}
        attempt = 0
        async with self._session() as http:
            while True:
                request = http.build_request(
                    "POST", path, json=body, headers=headers, params=params
                )
                settled = self._settle(await _send_async(http, request), attempt)
                if isinstance(settled, RunResult):
                    return settled
                await asyncio.sleep(settled)
                attempt += 1

    async def list_tools(self) -> list[ToolInfo]:
        async with self._session() as http:
            request = http.build_request(
                "GET",
                "/api/v2/apps/tools",
                params={"workspaceId": self.workspace_id},
                headers={"X-API-Key": self.api_key},
            )
            response = await _send_async(http, request)
        return self._tools(response)

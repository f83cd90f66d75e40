"""What changes between two versions of an app: its tools (added, removed, and for each
kept one its schemas, packages, effect, timeout, description, language and code), the
packages and the egress it asks for. What the Manage page shows before a publish, an
install, a switch or a roll back, so a person sees what every caller is about to get.

Never returns code: a tool's code is only "changed" or not.
"""

from __future__ import annotations

from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from runnerd.api.auth import caller_of
from runnerd.api.bodies import _Wire
from runnerd.api.ops import WORKSPACE, Op, Param, json_response, query_param
from runnerd.api.state import AppState
from runnerd.errors import AppNotFound, VersionNotFound
from runnerd.limits import MAX_DIFF_SCHEMA_CHANGES, MAX_SLUG_CHARS, MAX_VERSION_CHARS
from runnerd.store import Store, ToolRecord, VersionRecord

__all__ = ["OPS", "schema_changes"]


class SchemaChange(_Wire, omit_defaults=True):
    """One place where a schema differs: its JSON pointer, and the value before and after
    (absent on the side where the place does not exist)."""

    pointer: str
    kind: Literal["added", "removed", "changed"]
    before: Any = None
    after: Any = None


class ToolDiff(_Wire):
    name: str
    changed: list[str]  # which of: effect, timeout, description, language, code, inputSchema...
    input_schema: list[SchemaChange]
    output_schema: list[SchemaChange]
    packages_added: list[str]
    packages_removed: list[str]
    truncated: bool = False  # more schema changes than the answer lists


class VersionDiff(_Wire):
    app_slug: str
    from_version: str
    to_version: str
    tools_added: list[str]
    tools_removed: list[str]
    tools_changed: list[ToolDiff]  # only the kept tools that changed
    packages_added: list[str]  # over every tool of the version
    packages_removed: list[str]
    egress_added: list[str]
    egress_removed: list[str]


def schema_changes(before: Any, after: Any, pointer: str = "") -> list[SchemaChange]:
    """Every leaf where ``after`` differs from ``before`` (objects compared key by key,
    anything else as a whole), in pointer order."""
    if isinstance(before, dict) and isinstance(after, dict):
        found: list[SchemaChange] = []
        for key in sorted(set(before) | set(after)):
            at = f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key not in after:
                found.append(SchemaChange(pointer=at, kind="removed", before=before[key]))
            elif key not in before:
                found.append(SchemaChange(pointer=at, kind="added", after=after[key]))
            else:
                found += schema_changes(before[key], after[key], at)
        return found
    if before == after and type(before) is type(after):
        return []
    return [SchemaChange(pointer=pointer or "/", kind="changed", before=before, after=after)]


def _tool_diff(a: ToolRecord, b: ToolRecord) -> ToolDiff | None:
    changed = [
        word
        for word, differs in (
            ("effect", a.effect != b.effect),
            ("timeout", a.timeout_ms != b.timeout_ms),
            ("description", a.description != b.description),
            ("language", a.language != b.language),
            ("code", a.source != b.source or a.compiled_js != b.compiled_js),
            ("inputSchema", a.input_schema != b.input_schema),
            ("outputSchema", a.output_schema != b.output_schema),
            ("packages", a.packages != b.packages),
        )
        if differs
    ]
    if not changed:
        return None
    inputs = schema_changes(a.input_schema, b.input_schema)
    outputs = schema_changes(a.output_schema, b.output_schema)
    room = MAX_DIFF_SCHEMA_CHANGES
    return ToolDiff(
        name=a.name,
        changed=changed,
        input_schema=inputs[:room],
        output_schema=outputs[: max(0, room - len(inputs))],
        packages_added=sorted(set(b.packages) - set(a.packages)),
        packages_removed=sorted(set(a.packages) - set(b.packages)),
        truncated=len(inputs) + len(outputs) > room,
    )


def _diff(store: Store, slug: str, workspace_id: str, old: str, new: str) -> VersionDiff:
    app = store.get_app(slug)
    if app is None:
        raise AppNotFound(slug)

    def seen(version: str) -> VersionRecord:
        found = store.find_version(app.id, version)
        # The versions the workspace sees: its own app's, and published ones.
        if found is None or (app.workspace_id != workspace_id and not store.published_at(found.id)):
            raise VersionNotFound(f"{slug} has no version {version!r}")
        return found

    a, b = seen(old), seen(new)
    tools_a = {t.name: t for t in store.get_tools(a.id)}
    tools_b = {t.name: t for t in store.get_tools(b.id)}
    kept = sorted(set(tools_a) & set(tools_b))
    packages_a = {p for t in tools_a.values() for p in t.packages}
    packages_b = {p for t in tools_b.values() for p in t.packages}
    return VersionDiff(
        app_slug=slug,
        from_version=a.version,
        to_version=b.version,
        tools_added=sorted(set(tools_b) - set(tools_a)),
        tools_removed=sorted(set(tools_a) - set(tools_b)),
        tools_changed=[d for n in kept if (d := _tool_diff(tools_a[n], tools_b[n])) is not None],
        packages_added=sorted(packages_b - packages_a),
        packages_removed=sorted(packages_a - packages_b),
        egress_added=sorted(set(b.egress) - set(a.egress)),
        egress_removed=sorted(set(a.egress) - set(b.egress)),
    )


_SLUG = Param("appSlug", "The app's slug.", required=True, max_length=MAX_SLUG_CHARS, where="path")
_VERSION = Param(
    "version", "The version the diff goes to.", required=True, max_length=MAX_VERSION_CHARS,
    where="path",
)  # fmt: skip
_FROM = Param(
    "from", "The version the diff goes from.", required=True, max_length=MAX_VERSION_CHARS
)


async def version_diff(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    caller = await caller_of(request, state, "api:read")
    await caller.member(state.store, workspace_id, role="viewer")
    old = query_param(request, _FROM)  # after the caller: a stranger learns nothing here
    assert old is not None
    found = await state.store.io(
        _diff,
        state.store,
        request.path_params["appSlug"],
        workspace_id,
        old,
        request.path_params["version"],
    )
    return json_response(found)


OPS = [
    Op(
        "GET",
        "/api/v2/apps/{appSlug}/versions/{version}/diff",
        "diffVersions",
        "What changes from one version of an app to another",
        version_diff,
        VersionDiff,
        params=(WORKSPACE, _SLUG, _VERSION, _FROM),
        description="Tools added and removed; for each kept tool that changed, which of its "
        "effect, timeout, description, language, code, schemas and packages did, with every "
        "schema change by JSON pointer (a bounded number); the packages and egress the "
        "version asks for, added and removed. Both versions must be ones the workspace "
        "sees (its own app's, or published). Never returns code.",
    ),
]

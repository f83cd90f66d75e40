"""An app's bundle checked: the manifest, every tool file and source, the code.

``load_bundle`` checks a bundle (path -> bytes, as walk.read_app_dir reads it and a deploy
uploads it) against every rule of the manifest, the tool files (tool_file.py) and the
sources (code.py), and returns the checked ``Bundle``, or raises ``BundleRejected`` listing
every problem found, each with its file and, where there is one, its line.
"""

from __future__ import annotations

import hashlib
import ipaddress
import posixpath
from collections.abc import Mapping
from typing import Any

from ruamel.yaml.error import YAMLError

from runnerd import egress
from runnerd import limits as L
from runnerd.checks.schemas import check_document
from runnerd.errors import BundleRejected
from runnerd.model import Bundle, Manifest, Page, Problem, Tool
from runnerd.run.addresses import never_refusal
from runnerd.run.toolchain import Toolchain
from runnerd.upload.code import SourceFile, check_code
from runnerd.upload.imports import import_warnings
from runnerd.upload.pages import check_pages, folder_problem, not_pages_of
from runnerd.upload.tool_file import load_tool
from runnerd.upload.walk import glob_problem, match_globs, path_problems
from runnerd.upload.yamlfile import (
    decode_text,
    field_problems,
    line_of,
    load_yaml,
    plain,
    yaml_problem,
)

__all__ = ["load_bundle"]


# --- The manifest ---------------------------------------------------------------------------


def _load_manifest(files: Mapping[str, bytes], problems: list[Problem]) -> Manifest | None:
    name = L.MANIFEST_NAME
    if name not in files:
        problems.append(Problem(name, f"no {name} at the root of the app"))
        return None
    data = files[name]
    if len(data) > L.MAX_MANIFEST_BYTES:
        problems.append(Problem(name, f"is larger than {L.MAX_MANIFEST_BYTES // L.KB} KB"))
        return None
    text = decode_text(name, data, problems)
    if text is None:
        return None
    try:
        tree = load_yaml(text)
    except YAMLError as exc:
        problems.append(yaml_problem(name, exc))
        return None
    errors = check_document("agentserve.app", plain(tree))
    problems.extend(field_problems(name, tree, errors))
    if errors:
        return None
    globs = (tree["tools"],) if isinstance(tree["tools"], str) else tuple(tree["tools"])
    for i, pattern in enumerate(globs):
        path: tuple[str | int, ...] = ("tools",) if isinstance(tree["tools"], str) else ("tools", i)
        if (why := glob_problem(pattern)) is not None:
            problems.append(Problem(name, f"tools: {why}", line_of(tree, path)))
    pages = tree.get("pages")
    if pages is not None and (why := folder_problem(str(pages))) is not None:
        problems.append(Problem(name, f"pages: {why}", line_of(tree, ("pages",))))
    entry = tree.get("entry")
    if entry is not None and pages is None:
        why = "entry: names a page, and there is no pages folder"
        problems.append(Problem(name, why, line_of(tree, ("entry",))))
    version = tree.get("version")
    return Manifest(
        slug=str(tree["slug"]),
        name=str(tree["name"]),
        version=str(version) if version is not None else None,
        tools=tuple(str(g) for g in globs),
        text=text,
        egress=_egress(tree, problems),
        pages=str(pages) if pages is not None else None,
        entry=str(entry) if entry is not None else None,
    )


def _egress(tree: Any, problems: list[Problem]) -> tuple[str, ...]:
    """The manifest's egress entries in normal form; each bad or repeated entry is a
    problem with its line."""
    found: dict[str, int] = {}
    for i, entry in enumerate(tree.get("egress") or []):
        line = line_of(tree, ("egress", i))
        try:
            destination = egress.parse(str(entry))
        except egress.EgressError as exc:
            problems.append(Problem(L.MANIFEST_NAME, f"egress[{i}]: {exc}", line))
            continue
        normal = str(destination)
        # Only what no daemon may reach is refused here: a private literal may be opened by
        # the daemon's egress_allow_networks, and the proxy judges it at each connection.
        why = never_refusal(ipaddress.ip_address(destination.host)) if destination.ip else None
        if why is not None:
            problems.append(
                Problem(
                    L.MANIFEST_NAME,
                    f"egress[{i}]: egress never reaches {normal} ({why})",
                    line,
                )
            )
            continue
        if normal in found:
            problems.append(
                Problem(
                    L.MANIFEST_NAME,
                    f"egress[{i}]: {normal} is listed twice (first as egress[{found[normal]}])",
                    line,
                )
            )
        found.setdefault(normal, i)
    return tuple(found)


# --- The whole bundle -----------------------------------------------------------------------


def _with_manifest_lines(found: list[Problem], files: Mapping[str, bytes]) -> list[Problem]:
    """``found``, the manifest's problems with the line of the key they name (``entry:``,
    ``pages:``), where they have none."""
    if not any(p.file == L.MANIFEST_NAME and p.line is None for p in found):
        return found
    tree = load_yaml(files[L.MANIFEST_NAME].decode("utf-8", "replace"))
    out = []
    for problem in found:
        key = problem.message.split(":", 1)[0]
        if problem.file == L.MANIFEST_NAME and problem.line is None and key in ("entry", "pages"):
            problem = Problem(problem.file, problem.message, line_of(tree, (key,)))
        out.append(problem)
    return out


def load_bundle(files: Mapping[str, bytes], *, toolchain: Toolchain | None) -> Bundle:
    """Check ``files`` (path relative to the app root -> content) against every rule.

    Returns the checked Bundle; raises BundleRejected with every problem found. Never
    runs the tools' code. ``toolchain`` is needed for JavaScript and TypeScript tools.
    """
    problems: list[Problem] = []
    warnings: list[Problem] = []
    if len(files) > L.MAX_BUNDLE_FILES:
        raise BundleRejected(
            [
                Problem(
                    L.MANIFEST_NAME,
                    f"the upload holds {len(files):,} files; at most {L.MAX_BUNDLE_FILES:,}",
                )
            ]
        )
    bad_paths = path_problems(files)
    if bad_paths:
        raise BundleRejected(bad_paths)
    manifest = _load_manifest(files, problems)
    if manifest is None:
        raise BundleRejected(problems)

    named = match_globs(manifest.tools, [p for p in files if p != L.MANIFEST_NAME])
    tool_files = [p for p in named if p.endswith(L.TOOL_SUFFIX)]
    if not tool_files:
        problems.append(Problem(L.MANIFEST_NAME, "tools: the globs name no <name>.tool.yaml file"))
    if len(tool_files) > L.MAX_TOOLS_PER_APP:
        problems.append(
            Problem(
                L.MANIFEST_NAME,
                f"the globs name {len(tool_files)} tools; an "
                f"app ships at most {L.MAX_TOOLS_PER_APP}",
            )
        )
    stems = {p[: -len(L.TOOL_SUFFIX)] for p in tool_files}
    for path in named:
        if not path.endswith(L.TOOL_SUFFIX) and path.lower().endswith(L.TOOL_SUFFIX):
            warnings.append(
                Problem(
                    path,
                    f"is not a tool: a tool file's name ends in {L.TOOL_SUFFIX}, in lower case",
                )
            )
        root, ext = posixpath.splitext(path)
        if ext in L.SOURCE_LANGUAGES and root not in stems:
            warnings.append(
                Problem(
                    path,
                    f"has no {posixpath.basename(root)}{L.TOOL_SUFFIX} "
                    "beside it, so it is not a tool and is not uploaded",
                )
            )

    pages: tuple[Page, ...] = ()
    if manifest.pages is not None:
        not_pages = not_pages_of(named, tool_files)
        found: list[Problem] = []
        pages = check_pages(manifest.pages, manifest.entry, files, not_pages, found)
        problems.extend(_with_manifest_lines(found, files))

    drafts = [d for p in tool_files if (d := load_tool(p, files, problems)) is not None]
    by_name: dict[str, str] = {}
    for path in tool_files:
        stem = posixpath.basename(path)[: -len(L.TOOL_SUFFIX)]
        if stem in by_name:
            problems.append(
                Problem(
                    path,
                    f"a second tool named {stem!r} (the first is "
                    f"{by_name[stem]}); tool names are unique in an app",
                )
            )
        by_name.setdefault(stem, path)

    checks = check_code(
        [SourceFile(d.source_path, d.language, d.source, d.packages) for d in drafts], toolchain
    )
    tools: list[Tool] = []
    app_modules = frozenset(
        posixpath.splitext(posixpath.basename(p))[0] for p in files if p.endswith(".py")
    )
    for draft in drafts:
        check = checks[draft.source_path]
        problems.extend(Problem(draft.source_path, msg, line) for line, msg in check.problems)
        if check.problems or not draft.ok:
            continue
        if draft.language == "python":
            warnings += import_warnings(
                draft.source_path, draft.source, draft.packages, app_modules
            )
        doc = draft.doc
        tools.append(
            Tool(
                name=doc["name"],
                description=doc["description"],
                effect=doc.get("effect", L.DEFAULT_EFFECT),
                timeout_ms=doc.get("timeoutMs", L.DEFAULT_TIMEOUT_MS),
                input_schema=doc["input"],
                output_schema=doc["output"],
                packages=draft.packages,
                language=draft.language,
                yaml_path=draft.yaml_path,
                yaml_text=draft.yaml_text,
                source_path=draft.source_path,
                source=draft.source,
                compiled_js=check.compiled_js,
                module_format=check.module_format,
            )
        )
    if problems:
        raise BundleRejected(sorted(problems, key=lambda p: (p.file, p.line or 0)))
    tools.sort(key=lambda t: t.name)
    return Bundle(
        manifest, tuple(tools), tuple(warnings), _content_hash(manifest, tools, pages), pages
    )


def _content_hash(manifest: Manifest, tools: list[Tool], pages: tuple[Page, ...] = ()) -> str:
    """The sha256 of the manifest, every tool file, source and build, and every page (its
    path and digest; a version without pages hashes as before pages were)."""
    digest = hashlib.sha256()
    parts = [manifest.text]
    for tool in tools:
        parts += [tool.yaml_path, tool.yaml_text, tool.source_path, tool.source]
    for page in pages:
        parts += [page.path, page.sha256]
    for part in parts:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    return f"sha256:{digest.hexdigest()}"

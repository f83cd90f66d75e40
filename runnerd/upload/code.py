"""Code checks at upload: parse every source, compile TypeScript, find the `run` entry point.

Python is parsed in-process with ``ast``; JavaScript and TypeScript go through the
toolchain (esbuild + module lexers) in one Node process per upload. Nothing here runs
a tool's code.
"""

from __future__ import annotations

import ast

import msgspec

from runnerd.errors import ToolchainError
from runnerd.model import Language, ModuleFormat
from runnerd.run.toolchain import Toolchain
from runnerd.upload.pins import pin_name

__all__ = ["CodeCheck", "SourceFile", "check_code"]


class SourceFile(msgspec.Struct, frozen=True):
    path: str  # relative to the app root, as problems name it
    language: Language
    source: str
    packages: tuple[str, ...] = ()  # normalized pins, to check imports against


class CodeCheck(msgspec.Struct):
    """What the checks found for one source file."""

    problems: list[tuple[int | None, str]] = msgspec.field(default_factory=list)
    # What the jail runs when it is not the source: TypeScript compiled, or an ES module
    # that needs no module loader compiled to CommonJS; module_format is its format,
    # for JavaScript and TypeScript.
    compiled_js: str | None = None
    module_format: ModuleFormat | None = None


def check_code(files: list[SourceFile], toolchain: Toolchain | None) -> dict[str, CodeCheck]:
    """Check every file; the answer maps each path to its CodeCheck (empty problems = good)."""
    results = {f.path: _check_python(f) for f in files if f.language == "python"}
    js_files = [f for f in files if f.language != "python"]
    if js_files:
        results.update(_check_js(js_files, toolchain))
    return results


def _check_python(file: SourceFile) -> CodeCheck:
    try:
        tree = ast.parse(file.source, filename=file.path)
    except SyntaxError as exc:
        return CodeCheck(problems=[(exc.lineno, f"Python syntax error: {exc.msg}")])
    except ValueError as exc:  # null bytes in the source
        return CodeCheck(problems=[(None, f"cannot parse the Python source: {exc}")])
    problems: list[tuple[int | None, str]] = []
    run = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "run":
            run = node
    if run is None:
        problems.append((None, "no top-level `def run(input)` (or `async def run(input)`)"))
    else:
        args = run.args
        positional = len(args.posonlyargs) + len(args.args)
        required = positional - len(args.defaults)
        if (positional < 1 and args.vararg is None) or required > 1:
            problems.append((run.lineno, "run must take exactly one argument: the input"))
    for item in ast.walk(tree):
        if isinstance(item, ast.ImportFrom) and item.level > 0:
            problems.append(
                (item.lineno, "relative import: the sandbox receives only the tool's own file")
            )
    return CodeCheck(problems=problems)


def _package_name(specifier: str) -> str:
    parts = specifier.split("/")
    return "/".join(parts[:2]) if specifier.startswith("@") else parts[0]


def _check_js(files: list[SourceFile], toolchain: Toolchain | None) -> dict[str, CodeCheck]:
    if toolchain is None or toolchain.node is None:
        message = "JavaScript and TypeScript tools need Node.js >= 20, and none is configured"
        return {f.path: CodeCheck(problems=[(None, message)]) for f in files}
    try:
        answers = toolchain.check_sources(
            [{"path": f.path, "language": f.language, "source": f.source} for f in files]
        )
    except ToolchainError as exc:
        return {f.path: CodeCheck(problems=[(None, str(exc))]) for f in files}
    by_path = {f.path: f for f in files}
    results: dict[str, CodeCheck] = {}
    for answer in answers:
        file = by_path[answer["path"]]
        check = CodeCheck()
        results[file.path] = check
        if answer["errors"]:
            for err in answer["errors"]:
                column = f", column {err['column']}" if err.get("column") else ""
                kind = "TypeScript" if file.language == "typescript" else "JavaScript"
                check.problems.append(
                    (err.get("line"), f"{kind} syntax error{column}: {err['text']}")
                )
            continue
        check.compiled_js = answer["commonjs"] or answer["code"]
        check.module_format = "cjs" if answer["commonjs"] else answer["format"]
        exports = set(answer["exports"])
        if "run" not in exports and "default" not in exports:
            kind = "ES module" if answer["format"] == "esm" else "CommonJS module"
            check.problems.append(
                (None, f"{kind} without a `run` export or a default-exported function")
            )
        declared = {pin_name(p) for p in file.packages}
        for spec in answer["imports"]:
            if spec.startswith((".", "/")):
                check.problems.append(
                    (None, f"imports {spec!r}: the sandbox receives only the tool's own file")
                )
            elif (name := _package_name(spec)) not in declared:
                check.problems.append(
                    (None, f"imports {name!r}, which is not listed under `packages`")
                )
    return results

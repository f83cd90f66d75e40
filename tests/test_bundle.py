"""Every rule of seed 000's field and limits tables, refused and accepted, through
`runnerd app validate` (the real CLI entry point) and through the upload function."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from conftest import PY_SOURCE, TOOL_YAML, AppDir, upload_version
from runnerd.cli.main import main
from runnerd.errors import BundleRejected
from runnerd.run.toolchain import Toolchain
from runnerd.store import Store
from runnerd.upload.walk import read_app_dir

MakeApp = Callable[..., AppDir]


@pytest.fixture
def validate(
    capsys: pytest.CaptureFixture[str], toolchain: Toolchain, monkeypatch: pytest.MonkeyPatch
) -> Callable[[AppDir], tuple[int, dict[str, Any]]]:
    monkeypatch.setenv("RUNNERD_TOOLCHAIN_DIR", str(toolchain.directory))

    def run(app: AppDir) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        code = main(
            [
                "app",
                "validate",
                str(app.root),
                "--json",
                "--data-dir",
                str(app.root.parent / "data"),
            ]
        )
        return code, json.loads(capsys.readouterr().out)

    return run


def problems_of(result: tuple[int, dict[str, Any]]) -> list[str]:
    code, body = result
    assert code == 1, body
    return [f"{p['file']}:{p.get('line', '')}: {p['message']}" for p in body["problems"]]


def one_problem(result: tuple[int, dict[str, Any]], *needles: str) -> str:
    found = problems_of(result)
    assert len(found) == 1, found
    for needle in needles:
        assert needle in found[0], found[0]
    return found[0]


def accepted(result: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    code, body = result
    assert code == 0, body
    assert body["ok"] is True
    return body


def without(text: str, key: str) -> list[str]:
    """The lines of ``text`` less the field ``key`` and its indented block."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith(f"{key}:") or (skipping and line.startswith(" ")):
            skipping = True
            continue
        skipping = False
        out.append(line)
    return out


def tool_yaml(name: str = "t", **fields: str) -> str:
    """TOOL_YAML with fields replaced or added (on line 2): tool_yaml(timeoutMs="500")."""
    text = TOOL_YAML.format(name=name)
    for key, value in fields.items():
        lines = without(text, key)
        lines.insert(1, f"{key}: {value}")
        text = "\n".join(lines) + "\n"
    return text


# --- the manifest ---------------------------------------------------------------------------


def test_missing_manifest_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    (app.root / "agentserve.app.yaml").unlink()
    one_problem(validate(app), "agentserve.app.yaml", "no agentserve.app.yaml")


@pytest.mark.parametrize("slug", ["Deal_Desk", "deal--desk", "-deal", "a" * 65])
def test_bad_slug_is_refused_with_its_line(make_app: MakeApp, validate: Any, slug: str) -> None:
    app = make_app(f"name: Demo\nslug: '{slug}'\ntools: ./tools/*\n")
    app.tool("t")
    one_problem(validate(app), "agentserve.app.yaml:2:", "slug:")


def test_manifest_unknown_field_and_unquoted_version_are_refused(
    make_app: MakeApp, validate: Any
) -> None:
    app = make_app("slug: demo\nname: Demo\nversion: 1.2\ntool: x\ntools: ./tools/*\n")
    app.tool("t")
    found = problems_of(validate(app))
    assert any(":3: version:" in p and "quote it" in p for p in found), found
    assert any(":4: unknown field 'tool'" in p and "did you mean 'tools'" in p for p in found)


@pytest.mark.parametrize("tools", ["./tools/*", "[tools/*.tool.yaml]", "['tools/**']"])
def test_tools_globs_one_or_a_list(make_app: MakeApp, validate: Any, tools: str) -> None:
    app = make_app(f"slug: demo\nname: Demo\nversion: '1.2'\ntools: {tools}\n")
    app.tool("t")
    body = accepted(validate(app))
    assert [t["reference"] for t in body["tools"]] == ["demo/t"]
    assert body["app"]["version"] == "1.2"


def test_glob_outside_the_app_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app("slug: demo\nname: Demo\ntools:\n  - ./tools/*\n  - ../other/*\n")
    app.tool("t")
    one_problem(validate(app), "agentserve.app.yaml:5:", "reaches outside")


def test_globs_that_name_no_tool_are_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app("slug: demo\nname: Demo\ntools: ./lib/*\n")
    app.tool("t")
    one_problem(validate(app), "name no <name>.tool.yaml")


# --- name and description -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Score", "1score", "score-offer", "s" * 41])
def test_bad_tool_name_is_refused(make_app: MakeApp, validate: Any, name: str) -> None:
    app = make_app()
    app.tool(name, yaml=tool_yaml(name))
    found = problems_of(validate(app))
    assert any(f"tools/{name}.tool.yaml:1: name:" in p for p in found), found


def test_forty_character_name_is_accepted(make_app: MakeApp, validate: Any) -> None:
    name = "s" * 40
    app = make_app()
    app.tool(name)
    assert accepted(validate(app))["tools"][0]["name"] == name


def test_name_must_match_the_file_name(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("score_offer", yaml=tool_yaml("score"))
    one_problem(validate(app), "score_offer.tool.yaml:1:", "does not match the file name")


@pytest.mark.parametrize(("length", "ok"), [(1024, True), (1025, False)])
def test_description_at_most_1024_characters(
    make_app: MakeApp, validate: Any, length: int, ok: bool
) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(description="d" * length))
    result = validate(app)
    if ok:
        accepted(result)
    else:
        one_problem(result, "t.tool.yaml:2:", "description:", "1,024")


@pytest.mark.parametrize("field", ["name", "description", "input", "output"])
def test_required_fields(make_app: MakeApp, validate: Any, field: str) -> None:
    app = make_app()
    text = "\n".join(without(tool_yaml(), field))
    app.tool("t", yaml=text + "\n")
    found = problems_of(validate(app))
    assert any(f"{field} is required" in p for p in found), found


# --- input and output -----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["input", "output"])
def test_schema_must_be_type_object(make_app: MakeApp, validate: Any, key: str) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(**{key: "{ type: array }"}))
    one_problem(validate(app), f"{key}.type")


@pytest.mark.parametrize("key", ["input", "output"])
def test_schema_over_32_kb_is_refused(make_app: MakeApp, validate: Any, key: str) -> None:
    big = json.dumps({"type": "object", "description": "x" * (32 * 1024)})
    app = make_app()
    app.tool("t", yaml=tool_yaml(**{key: big}))
    one_problem(validate(app), f"{key}: the schema is", "32 KB")


def test_schema_just_under_32_kb_is_accepted(make_app: MakeApp, validate: Any) -> None:
    filler = "x" * (32 * 1024 - 60)
    app = make_app()
    app.tool("t", yaml=tool_yaml(input=json.dumps({"type": "object", "description": filler})))
    accepted(validate(app))


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("{type: object, properties: {a: {type: nope}}}", "Unknown type"),
        ("{type: object, properties: {a: {minimum: x}}}", "minimum must be a number"),
        (
            "{type: object, properties: {a: {$ref: 'https://example.invalid/s.json'}}}",
            "points outside the schema",
        ),
        ("{type: object, properties: {a: {pattern: '('}}}", "not a usable JSON Schema"),
    ],
)
def test_uncompilable_schema_is_an_upload_error(
    make_app: MakeApp, validate: Any, schema: str, why: str
) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(output=schema))
    one_problem(validate(app), "output: not a usable JSON Schema", why)


# --- effect and timeoutMs -------------------------------------------------------------------


@pytest.mark.parametrize(("effect", "ok"), [("read", True), ("write", True), ("delete", False)])
def test_effect(make_app: MakeApp, validate: Any, effect: str, ok: bool) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(effect=effect))
    result = validate(app)
    if ok:
        assert accepted(result)["tools"][0]["effect"] == effect
    else:
        one_problem(result, "effect:")


def test_defaults_are_read_and_30_seconds(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t")
    tool = accepted(validate(app))["tools"][0]
    assert (tool["effect"], tool["timeoutMs"]) == ("read", 30000)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("999", False),
        ("1000", True),
        ("300000", True),
        ("300001", False),
        ("'10s'", False),
        ("1500.5", False),
    ],
)
def test_timeout_range(make_app: MakeApp, validate: Any, value: str, ok: bool) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(timeoutMs=value))
    result = validate(app)
    if ok:
        assert accepted(result)["tools"][0]["timeoutMs"] == int(value)
    else:
        one_problem(result, "t.tool.yaml:2: timeoutMs:")


# --- packages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ext", "pins", "expected"),
    [
        (".ts", ["zod@3.25.76", "@types/node@20.11.5"], ["@types/node@20.11.5", "zod@3.25.76"]),
        (
            ".py",
            ["Requests==2.32.3", "attrs@24.2.0", "pydantic[email]==2.9.2"],
            ["attrs==24.2.0", "pydantic[email]==2.9.2", "requests==2.32.3"],
        ),
    ],
)
def test_exact_pins_are_accepted_and_normalized(
    make_app: MakeApp, validate: Any, ext: str, pins: list[str], expected: list[str]
) -> None:
    app = make_app()
    source = "import zod from 'zod'\n" + "export const run = (i: unknown) => i\n"
    app.tool(
        "t",
        ext,
        yaml=tool_yaml(packages=json.dumps(pins)),
        source=source if ext == ".ts" else PY_SOURCE,
    )
    assert accepted(validate(app))["tools"][0]["packages"] == expected


@pytest.mark.parametrize(
    ("ext", "pin", "why"),
    [
        (".ts", "zod@^3.25.0", "range"),
        (".ts", "zod@3", "range"),
        (".ts", "zod@latest", "tag"),
        (".ts", "zod", "no version"),
        (".ts", "zod@git+https://example.invalid/zod.git", "URL"),
        (".ts", "zod@https://example.invalid/zod.tgz", "URL"),
        (".ts", "requests==2.32.3", "PyPI syntax"),
        (".py", "requests>=2.0", "range"),
        (".py", "requests~=2.32", "range"),
        (".py", "requests==2.*", "range"),
        (".py", "requests", "no version"),
        (".py", "requests @ https://example.invalid/r.whl", "URL"),
        (".py", "@scope/pkg@1.0.0", "npm package"),
        (".py", "requests==2.0; python_version<'3.12'", "marker"),
    ],
)
def test_non_exact_or_wrong_ecosystem_pins_are_refused(
    make_app: MakeApp, validate: Any, ext: str, pin: str, why: str
) -> None:
    app = make_app()
    app.tool("t", ext, yaml=tool_yaml(packages=json.dumps([pin])))
    one_problem(validate(app), "t.tool.yaml:2: packages[0]:", why)


def test_at_most_50_packages(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(packages=json.dumps([f"p{i}==1.0" for i in range(51)])))
    one_problem(validate(app), "packages:", "at most 50")


def test_a_package_listed_twice_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(packages='["attrs==24.2.0", "Attrs==23.1.0"]'))
    one_problem(validate(app), "packages[1]:", "listed twice")


# --- sources --------------------------------------------------------------------------------


def test_tool_without_source_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.write("tools/t.tool.yaml", tool_yaml())
    one_problem(validate(app), "tools/t.tool.yaml", "no source file")


def test_tool_with_two_sources_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t")
    app.write("tools/t.ts", "export const run = (i: unknown) => i\n")
    one_problem(validate(app), "tools/t.tool.yaml", "2 source files", "tools/t.py", "tools/t.ts")


def test_source_over_512_kb_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", source=PY_SOURCE + "#" * (512 * 1024))
    one_problem(validate(app), "tools/t.py", "512 KB")


def test_source_of_exactly_512_kb_is_accepted(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", source=PY_SOURCE + "#" * (512 * 1024 - len(PY_SOURCE) - 1) + "\n")
    accepted(validate(app))


@pytest.mark.parametrize(
    ("ext", "source", "language"),
    [
        (".py", PY_SOURCE, "python"),
        (".py", "async def run(input):\n    return input\n", "python"),
        (".ts", "export function run(i: object): object { return i }\n", "typescript"),
        (".mts", "export default async (i: object) => i\n", "typescript"),
        (".mjs", "export default function (input) { return input }\n", "javascript"),
        (".js", "module.exports = { run(input) { return input } }\n", "javascript"),
        (".js", "exports.run = async (input) => input\n", "javascript"),
        (".js", "module.exports = function (input) { return input }\n", "javascript"),
        (".js", "export const run = (input) => input\n", "javascript"),
    ],
)
def test_every_source_kind_is_accepted(
    make_app: MakeApp, validate: Any, ext: str, source: str, language: str
) -> None:
    app = make_app()
    app.tool("t", ext, source=source)
    tool = accepted(validate(app))["tools"][0]
    assert (tool["language"], tool["source"]) == (language, f"tools/t{ext}")


def test_at_most_50_tools(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    for i in range(50):
        app.tool(f"t{i}")
    assert len(accepted(validate(app))["tools"]) == 50
    app.tool("t50")
    one_problem(validate(app), "agentserve.app.yaml", "51 tools", "at most 50")


def test_unknown_field_is_refused_with_a_suggestion(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml(timeout="1000"))
    one_problem(validate(app), "t.tool.yaml:2:", "unknown field 'timeout'", "timeoutMs")


def test_yaml_syntax_error_names_the_line(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", yaml="name: t\ndescription: x\ninput: {type: object\noutput: {type: object}\n")
    one_problem(validate(app), "t.tool.yaml:4:", "invalid YAML")


def test_duplicate_key_is_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t", yaml=tool_yaml() + "name: t\n")
    one_problem(validate(app), "t.tool.yaml", "invalid YAML", "duplicate key")


def test_two_tools_with_one_name_are_refused(make_app: MakeApp, validate: Any) -> None:
    app = make_app("slug: demo\nname: Demo\ntools: ./tools/**\n")
    app.write("tools/a/t.tool.yaml", tool_yaml())
    app.write("tools/a/t.py", PY_SOURCE)
    app.write("tools/b/t.tool.yaml", tool_yaml())
    app.write("tools/b/t.py", PY_SOURCE)
    one_problem(validate(app), "tools/b/t.tool.yaml", "a second tool named 't'")


def test_source_without_a_tool_file_is_a_warning(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("t")
    app.write("tools/helpers.py", "X = 1\n")
    body = accepted(validate(app))
    assert [w["file"] for w in body["warnings"]] == ["tools/helpers.py"]


# --- code checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ext", "source", "where", "why"),
    [
        (
            ".ts",
            "export function run(x: number {\n  return x\n}\n",
            "t.ts:1:",
            "TypeScript syntax error, column 31",
        ),
        (
            ".mts",
            "const a = 1\nexport const run = (: number) => 1\n",
            "t.mts:2:",
            "TypeScript syntax error",
        ),
        (
            ".js",
            "module.exports = {\n  run(input) {\n    return input\n  \n",
            "t.js:5:",
            "JavaScript syntax error",
        ),
        (".py", "def run(input):\n    return {\n", "t.py:2:", "Python syntax error"),
    ],
)
def test_syntax_error_names_file_and_line(
    make_app: MakeApp, validate: Any, ext: str, source: str, where: str, why: str
) -> None:
    app = make_app()
    app.tool("t", ext, source=source)
    one_problem(validate(app), where, why)


@pytest.mark.parametrize(
    ("ext", "source", "why"),
    [
        (".ts", "export const POLICY = {}\n", "without a `run` export"),
        (".mjs", "export function handler(input) { return input }\n", "without a `run` export"),
        (".js", "function run(input) { return input }\n", "CommonJS module without"),
        (".py", "def handler(input):\n    return input\n", "no top-level `def run(input)`"),
        (".py", "class T:\n    def run(self, input):\n        return input\n", "no top-level"),
        (".py", "def run():\n    return {}\n", "exactly one argument"),
    ],
)
def test_module_without_run_is_refused(
    make_app: MakeApp, validate: Any, ext: str, source: str, why: str
) -> None:
    app = make_app()
    app.tool("t", ext, source=source)
    one_problem(validate(app), f"tools/t{ext}", why)


@pytest.mark.parametrize(
    ("ext", "source", "why"),
    [
        (".ts", "import { x } from '../src/lib'\nexport const run = () => x\n", "'../src/lib'"),
        (".js", "const h = require('./helpers')\nexports.run = h\n", "'./helpers'"),
        (".py", "from .helpers import x\ndef run(input):\n    return x\n", "relative import"),
        (".ts", "import { z } from 'zod'\nexport const run = () => z\n", "'zod', which is not"),
        (".js", "const _ = require('lodash/fp')\nexports.run = _\n", "'lodash', which is not"),
    ],
)
def test_imports_the_sandbox_cannot_satisfy_are_refused(
    make_app: MakeApp, validate: Any, ext: str, source: str, why: str
) -> None:
    app = make_app()
    app.tool("t", ext, source=source)
    one_problem(validate(app), f"tools/t{ext}", why)


def test_node_builtins_need_no_package(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool(
        "t",
        ".ts",
        source="import { createHash } from 'node:crypto'\nimport fs from 'fs'\n"
        "import { join } from 'path/posix'\nexport const run = () => ({})\n",
    )
    accepted(validate(app))


@pytest.mark.smoke
def test_five_problems_in_five_files_are_all_reported(make_app: MakeApp, validate: Any) -> None:
    app = make_app()
    app.tool("a", yaml=tool_yaml("a", timeoutMs="50"))  # a.tool.yaml: timeout
    app.tool("b", ".ts", source="export function run(x: number {}\n")  # b.ts: syntax
    app.tool("c", source="def handler(input):\n    return input\n")  # c.py: no run
    app.tool("d", yaml=tool_yaml("d", packages='["numpy>=2"]'))  # d.tool.yaml: range
    app.write("tools/e.tool.yaml", tool_yaml("e"))  # e: no source
    found = problems_of(validate(app))
    assert len(found) == 5, found
    files = sorted(p.split(":", 1)[0] for p in found)
    assert files == [
        "tools/a.tool.yaml",
        "tools/b.ts",
        "tools/c.py",
        "tools/d.tool.yaml",
        "tools/e.tool.yaml",
    ]


# --- upload: all or nothing -----------------------------------------------------------------


def _counts(store: Store) -> tuple[int, int, int]:
    return tuple(  # type: ignore[return-value]
        store.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t in ("apps", "app_versions", "tools")
    )


def test_upload_with_a_problem_stores_nothing(
    make_app: MakeApp, store: Store, toolchain: Toolchain
) -> None:
    app = make_app()
    app.tool("good")
    app.tool("bad", ".ts", source="export function run(x: number {}\n")
    with pytest.raises(BundleRejected) as caught:
        upload_version(store, read_app_dir(app.root), toolchain=toolchain)
    assert [str(p) for p in caught.value.problems] == [
        'tools/bad.ts:1: TypeScript syntax error, column 31: Expected ")" but found "{"'
    ]
    assert _counts(store) == (0, 0, 0)


@pytest.mark.smoke
def test_good_upload_stores_an_immutable_version(
    make_app: MakeApp, store: Store, toolchain: Toolchain
) -> None:
    app = make_app()
    app.tool("py_tool")
    app.tool("ts_tool", ".ts")
    version, _ = upload_version(store, read_app_dir(app.root), toolchain=toolchain)
    assert (version.app_slug, version.version, version.tool_names) == (
        "demo",
        "1",
        ("py_tool", "ts_tool"),
    )
    ts = store.get_tool(version.id, "ts_tool")
    # compiled to CommonJS: it imports no package
    assert ts is not None and ts.language == "typescript" and ts.module_format == "cjs"
    assert ts.compiled_js is not None and "input.n + 1" in ts.compiled_js
    assert ": number" not in ts.compiled_js.split("//# sourceMappingURL")[0]
    assert ts.input_schema["required"] == ["n"]
    assert _counts(store) == (1, 1, 2)

"""The published schemas: valid, used by the loader, and accepting the seed's tool file."""

from __future__ import annotations

import json

import fastjsonschema
from ruamel.yaml import YAML

from conftest import EXAMPLE, REPO
from runnerd.checks.schemas import check_document, compile_schema, published_schema, schemas_dir


def test_loader_reads_the_checked_in_schemas() -> None:
    assert schemas_dir() == REPO / "schemas"
    for name in ("agentserve.tool", "agentserve.app"):
        on_disk = json.loads((REPO / "schemas" / f"{name}.schema.json").read_text())
        assert published_schema(name) == on_disk
        assert on_disk["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_seed_score_offer_tool_file_validates_against_the_published_schema() -> None:
    path = EXAMPLE / "tools" / "score_offer.tool.yaml"
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# yaml-language-server: $schema=")
    assert first_line.endswith("/schemas/agentserve.tool.schema.json")
    doc = YAML(typ="safe").load(path.read_text())
    validate = fastjsonschema.compile(published_schema("agentserve.tool"))
    validate(doc)  # raises if the whole-schema check refuses it
    assert check_document("agentserve.tool", doc) == []


def test_example_manifest_validates_against_the_published_schema() -> None:
    doc = YAML(typ="safe").load((EXAMPLE / "agentserve.app.yaml").read_text())
    fastjsonschema.compile(published_schema("agentserve.app"))(doc)


def test_every_field_error_is_reported_not_only_the_first() -> None:
    errors = check_document(
        "agentserve.tool",
        {"name": "Bad", "description": "", "effect": "x", "timeoutMs": 1, "extra": 1},
    )
    paths = sorted(str(e.path[0]) for e in errors)
    assert paths == ["description", "effect", "extra", "input", "name", "output", "timeoutMs"]


def test_compiled_schema_never_fills_defaults_into_input() -> None:
    validate = compile_schema(
        {"type": "object", "properties": {"a": {"type": "number", "default": 5}}}
    )
    data: dict[str, object] = {}
    validate(data)
    assert data == {}

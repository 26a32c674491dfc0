"""crds/trainingjob.yaml, and the chart's copy the chart installs, are generated from the models and
must never be stale."""

from pathlib import Path

import yaml

from slicekeeper import crd

ROOT = Path(__file__).parents[2]
CRD_FILE = ROOT / "crds" / "trainingjob.yaml"
CHART_CRD_FILE = ROOT / "charts" / "slicekeeper" / "crds" / "trainingjob.yaml"


def test_the_committed_crd_matches_the_models():
    assert CRD_FILE.read_text() == crd.render_crd_yaml(), "crds/trainingjob.yaml is stale: run `make crds`"


def test_the_chart_installs_the_same_crd():
    stale = "charts/slicekeeper/crds/trainingjob.yaml is stale: run `make crds`"
    assert CHART_CRD_FILE.read_text() == crd.render_crd_yaml(), stale


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_the_schema_is_structural():
    schema = crd.openapi_schema()
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "const" not in node and "title" not in node
        assert node.get("additionalProperties") is not False
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True


def test_the_crd_has_status_subresource_printer_columns_and_short_name():
    document = yaml.safe_load(CRD_FILE.read_text())
    version = document["spec"]["versions"][0]
    assert document["metadata"]["name"] == "trainingjobs.slicekeeper.dev"
    assert document["spec"]["names"]["shortNames"] == ["tj"]
    assert version["subresources"] == {"status": {}}
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Phase", "Goodput", "Age"}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["slices"]["minimum"] == 0 and spec["properties"]["slices"]["exclusiveMinimum"]


def _as_json_schema(node):
    """OpenAPI 3.0 -> JSON Schema draft 4 (whose exclusiveMinimum is the same boolean form)."""
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {k: _as_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") and "type" in converted:
        converted["type"] = [converted["type"], "null"]
    return converted


def _validator():
    import jsonschema

    document = yaml.safe_load(CRD_FILE.read_text())
    schema = _as_json_schema(document["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return jsonschema.Draft4Validator(schema)


def test_the_crd_schema_accepts_the_example():
    example = yaml.safe_load((Path(__file__).parents[2] / "examples" / "trainingjob.yaml").read_text())
    assert list(_validator().iter_errors(example)) == []


def test_the_crd_schema_rejects_what_the_models_reject():
    example = yaml.safe_load((Path(__file__).parents[2] / "examples" / "trainingjob.yaml").read_text())
    example["spec"]["slices"] = 0
    example["spec"]["checkpoint"]["interval"] = "often"
    messages = [e.message for e in _validator().iter_errors(example)]
    assert len(messages) == 2


def test_a_map_in_the_status_keeps_its_value_schema_so_the_api_server_does_not_prune_its_keys():
    status = crd.openapi_schema()["properties"]["status"]
    assert status["properties"]["restarts"] == {"type": "object", "additionalProperties": {"type": "integer"}}

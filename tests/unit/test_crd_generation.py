"""crds/trainingjob.yaml is generated from the models and must never be stale."""

from pathlib import Path

import yaml

from slicekeeper import crd

CRD_FILE = Path(__file__).parents[2] / "crds" / "trainingjob.yaml"


def test_the_committed_crd_matches_the_models():
    assert CRD_FILE.read_text() == crd.render_crd_yaml(), "crds/trainingjob.yaml is stale: run `make crds`"


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

"""Generate the TrainingJob CustomResourceDefinition from the pydantic models.

The CRD is never edited by hand: `make crds` (or `slicekeeper crd`) regenerates
`crds/trainingjob.yaml`, and a test fails when the file is stale. The JSON schema pydantic emits is
turned into a Kubernetes structural schema: references inlined, `Optional` as `nullable`, numeric
`exclusiveMinimum` in OpenAPI 3.0 form, no titles, metadata left to the API server.
"""

from __future__ import annotations

from typing import Any

import yaml

from slicekeeper import api

_DROP = {"title", "additionalProperties", "$defs"}
"""Not in a structural schema; except a map's value schema (`dict[str, int]`: additionalProperties
{type: integer}), restored below, without which the API server would prune every key of the map."""


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _resolve(defs[node["$ref"].split("/")[-1]], defs)
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **_resolve(extra, defs)}
    values = node.get("additionalProperties")
    node = {k: _resolve(v, defs) for k, v in node.items() if k not in _DROP}
    if isinstance(values, dict):
        node["additionalProperties"] = _resolve(values, defs)
    variants = node.get("anyOf")
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) == 1:
            del node["anyOf"]
            node = {**non_null[0], **node, "nullable": True}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node.get(bound), bool):
            node[plain] = node[bound]
            node[bound] = True
    if node.get("default", 0) is None:
        del node["default"]
    return node


def openapi_schema() -> dict[str, Any]:
    schema = api.TrainingJob.model_json_schema(by_alias=True, mode="validation")
    resolved = _resolve(schema, schema.get("$defs", {}))
    properties = resolved["properties"]
    properties["metadata"] = {"type": "object"}
    return {"type": "object", "required": ["spec"], "properties": properties}


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "TPU", "type": "string", "jsonPath": ".spec.tpu.type"},
    {"name": "Slices", "type": "integer", "jsonPath": ".spec.slices"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.slicesReady"},
    {"name": "Active", "type": "integer", "jsonPath": ".status.slicesActive"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.lastCheckpointStep"},
    {"name": "Goodput", "type": "number", "jsonPath": ".status.goodput"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.API_GROUP}"},
        "spec": {
            "group": api.API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "plural": api.PLURAL,
                "singular": api.KIND.lower(),
                "shortNames": [api.SHORT_NAME],
            },
            "versions": [
                {
                    "name": api.API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = "# Generated from slicekeeper/api.py by `make crds` (slicekeeper crd). Do not edit.\n"


def render_crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)

"""What a Kubernetes API server does with a CustomResourceDefinition's structural schema on every
write of a custom resource: prune, default, validate (for tests/support/cluster_emulator.py).

The operator's tests run against an emulated API server; without this, a TrainingJob there keeps
fields a real API server drops (so code that reads them works only in the tests), misses the
defaults a real one fills in, and accepts specs a real one refuses with 422 (so a test of the
operator's own validation may test a path no real cluster reaches). The rules, from the Kubernetes
documentation of CRD structural schemas (apiextensions.k8s.io/v1):

- pruning: a field the schema does not name is dropped, unless its object says
  `x-kubernetes-preserve-unknown-fields: true` or has an `additionalProperties` schema (a map);
  `apiVersion`, `kind` and `metadata` are the API server's and never pruned here; a `null` where the
  schema does not allow one (`nullable`) is dropped too, so that a default can take its place;
- defaulting, after pruning: a missing field whose schema has a `default` gets a copy of it, at every
  level of the objects that exist (an absent `status` gets no defaults: it has no default itself);
- validation: the OpenAPI v3.0 schema checked with `jsonschema` (Draft 4, whose `exclusiveMinimum:
  true` is the OpenAPI 3.0 form; `nullable` turned into a `null` type); the errors are reported the
  way the API server words its 422 answer, one `path: Invalid value: ...: why` per field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

Schema = Mapping[str, Any]
SERVER_FIELDS = ("apiVersion", "kind", "metadata")
"""Top-level fields the API server owns: never pruned by the CRD's schema."""


def crd_schema(path: Path, version: str) -> Schema:
    """The openAPIV3Schema of `version` in the CRD file at `path`."""
    crd = yaml.safe_load(path.read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)


def prune(value: Any, schema: Schema) -> Any:
    """`value` without the fields `schema` does not know (a new value; `value` is not changed)."""
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        values = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or values is True
        kept: dict[str, Any] = {}
        for key, item in value.items():
            field = properties.get(key) if key in properties else values if isinstance(values, dict) else None
            if field is None:
                if keep_unknown:
                    kept[key] = copy.deepcopy(item)
            elif item is None and not field.get("nullable"):
                continue  # a null where none is allowed is dropped, so that a default takes its place
            else:
                kept[key] = prune(item, field)
        return kept
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [prune(item, schema["items"]) for item in value]
    return copy.deepcopy(value)


def fill_defaults(value: Any, schema: Schema) -> Any:
    """`value` with every missing field that has a default set to it (in place; returned)."""
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        for key, field in properties.items():
            if key not in value and "default" in field:
                value[key] = copy.deepcopy(field["default"])
            if key in value and value[key] is not None:
                fill_defaults(value[key], field)
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            for key in value.keys() - properties.keys():
                if value[key] is not None:
                    fill_defaults(value[key], values)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            fill_defaults(item, schema["items"])
    return value


def _as_json_schema(node: Any) -> Any:
    """The OpenAPI v3.0 schema as Draft 4 JSON Schema: `nullable: true` allows null."""
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _as_json_schema(item) for key, item in node.items() if key != "default"}
    if converted.pop("nullable", False):
        if isinstance(converted.get("type"), str):
            converted["type"] = [converted["type"], "null"]
        if "enum" in converted:
            converted["enum"] = [*converted["enum"], None]
    return converted


class StructuralSchema:
    """One custom resource's schema, applied to each object written, as the API server applies it."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._validator = jsonschema.Draft4Validator(_as_json_schema(dict(schema)))

    def admit(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """`obj` pruned and defaulted (a new object)."""
        owned = {key: value for key, value in obj.items() if key not in SERVER_FIELDS}
        admitted = fill_defaults(prune(owned, self.schema), self.schema)
        return {**{key: copy.deepcopy(obj[key]) for key in SERVER_FIELDS if key in obj}, **admitted}

    def errors(self, obj: Mapping[str, Any]) -> list[str]:
        """What is invalid in `obj`, one `path: Invalid value: ...: why` per error (none: valid)."""
        found = []
        checked = {key: value for key, value in obj.items() if key != "metadata"}
        for error in sorted(self._validator.iter_errors(checked), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(part) for part in error.absolute_path) or "<root>"
            found.append(f"{path}: Invalid value: {json.dumps(error.instance)}: {error.message}")
        return found

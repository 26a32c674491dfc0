"""Plain JSON for the policy API's frozen dataclasses: field values checked on the way back in.

The policy objects (slicekeeper.policy) travel as JSON in the leader's event log and in the report;
replay reads them back from files a person may have edited, so every field is checked against its
declared type (int, float, str, `X | None`, `tuple[int, ...]`) with a message naming it. Stdlib only.
Named codec, not json, so that no one mistakes it for the standard library's `json` (which replay
imports next to it).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def mapping(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: expected an object, found {type(data).__name__}")
    return data


def typed(value: Any, hint: Any, what: str) -> Any:
    """`value` checked against a field type: int, float, str, `X | None`, `tuple[int, ...]`."""
    if isinstance(hint, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (hint,) = [o for o in options if o is not type(None)]
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{what}: expected a list, found {type(value).__name__}")
        return tuple(typed(item, typing.get_args(hint)[0], what) for item in value)
    if hint is float and is_int(value):
        return float(value)
    if hint is int and not is_int(value):
        raise ValueError(f"{what}: expected a whole number, found {value!r}")
    if not isinstance(value, hint):
        raise ValueError(f"{what}: expected {hint.__name__}, found {value!r}")
    return value


def fields_to_json(obj: Any, skip: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    return {
        f.name: list(value) if isinstance(value := getattr(obj, f.name), tuple) else value
        for f in dataclasses.fields(obj)
        if f.name not in skip
    }


def fields_from_json(
    cls: type[T], record: Mapping[str, Any], what: str, *, tag: str = "", skip: set[str] | None = None
) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    skipped = skip or set()
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(record) - known - {tag} - skipped
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(sorted(unknown))}")
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in skipped:
            continue
        if f.name not in record:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{what}: missing field '{f.name}'")
            continue
        values[f.name] = typed(record[f.name], hints[f.name], f"{what}.{f.name}")
    return values

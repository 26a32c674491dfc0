"""The journal as a change from the one before: what a leader sends its journal replicas.

The job's journal (supervisor.leader.journal) is its whole memory, and it only grows: lists of
faults, detections, recoveries and decisions get new entries at their end, and a few values change
(the state, the generation, budgets). Sent whole at every command it would cost bytes in proportion
to the job's history; as a change from the previous journal (`diff`), a command costs what changed.
A replica that holds the previous journal applies the change (`apply`) and holds the same journal
as the leader; one that does not is sent the journal whole.

A change is a list of operations on paths of keys from the journal's root:
- ["set", path, value]: the value at `path` is now `value` (a new key, or one that changed);
- ["extend", path, items]: the list at `path` has `items` more at its end;
- ["drop", path]: the key at `path` is gone.
Only JSON values travel (dicts with string keys, lists, scalars), as the journal is JSON.
"""

from __future__ import annotations

from typing import Any

Operation = list[Any]
Change = list[Operation]


def diff(old: Any, new: Any) -> Change:
    """The operations that turn `old` into `new` (both JSON values; [] when they are equal)."""
    change: Change = []
    _diff(old, new, [], change)
    return change


def _diff(old: Any, new: Any, path: list[str | int], change: Change) -> None:
    if type(old) is not type(new):
        change.append(["set", path, new])
    elif isinstance(old, dict):
        for key, value in new.items():
            if key not in old:
                change.append(["set", [*path, key], value])
            else:
                _diff(old[key], value, [*path, key], change)
        change.extend(["drop", [*path, key]] for key in old if key not in new)
    elif isinstance(old, list):
        _diff_list(old, new, path, change)
    elif old != new:
        change.append(["set", path, new])


def _diff_list(old: list[Any], new: list[Any], path: list[str | int], change: Change) -> None:
    """A list that only grew, or whose entries (dicts, lists) changed inside, changes by those parts;
    any other list is set whole (a list of steps or hosts is short)."""
    if old == new:
        return
    if len(new) < len(old):
        change.append(["set", path, new])
        return
    inner: Change = []
    for index, (before, after) in enumerate(zip(old, new, strict=False)):
        if before == after:
            continue
        if not isinstance(before, (dict, list)) or type(before) is not type(after):
            change.append(["set", path, new])
            return
        _diff(before, after, [*path, index], inner)
    change.extend(inner)
    if len(new) > len(old):
        change.append(["extend", path, new[len(old) :]])


def apply(journal: dict[str, Any], change: Change) -> dict[str, Any]:
    """`journal` with `change` made to it, in place (returned for convenience). ValueError for an
    operation that does not fit the journal (the change was made against another one)."""
    for operation in change:
        kind, path = operation[0], operation[1]
        if kind not in ("set", "extend", "drop") or not isinstance(path, list):
            raise ValueError(f"journal change: not an operation: {operation!r:.200}")
        if not path:
            if kind != "set" or not isinstance(operation[2], dict):
                raise ValueError("journal change: the root can only be replaced by a journal")
            journal.clear()
            journal.update(operation[2])
            continue
        parent = _at(journal, path[:-1])
        key = path[-1]
        if kind == "set":
            _check_key(parent, key, operation)
            parent[key] = operation[2]
        elif kind == "extend":
            target = _at(journal, path)
            if not isinstance(target, list):
                raise ValueError(f"journal change: no list at {path} to extend")
            target.extend(operation[2])
        else:
            if not isinstance(parent, dict) or key not in parent:
                raise ValueError(f"journal change: nothing at {path} to drop")
            del parent[key]
    return journal


def _at(journal: dict[str, Any], path: list[Any]) -> Any:
    node: Any = journal
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"journal change: no {path} in the journal") from None
    return node


def _check_key(parent: Any, key: Any, operation: Operation) -> None:
    if isinstance(parent, dict) and isinstance(key, str):
        return
    if isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent):
        return
    raise ValueError(f"journal change: cannot set {operation[1]}")

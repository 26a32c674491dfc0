"""Fault injection specs: `kill:host=1@step=30,hang:host=0@step=60`.

Shared by tests and users (`--chaos`). A spec is a comma-separated list of faults, each
`KIND:ARGS@step=S`; ARGS are `key=value` pairs (or a bare value) separated by commas, so a fault may
carry several (`slow:host=2,factor=2@step=30`): a comma starts a new fault only when what follows
looks like `KIND:`. Each fault fires exactly once, the first time its host reaches step S.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from slicekeeper.errors import UserError


class FaultKind(StrEnum):
    KILL = "kill"
    """SIGKILL of the workload process."""
    HANG = "hang"
    """The workload stays alive but stops making progress (SIGSTOP)."""
    LOSE = "lose"
    """The host is gone for good: supervisor and workload killed, its local disk (local tier and the
    peer replicas it held) deleted. A spare must take over its identity."""
    CORRUPT = "corrupt"
    """Bytes flipped in the host's newest committed local checkpoint; noticed at the next restore."""


@dataclass(frozen=True)
class KindRules:
    required: frozenset[str]
    optional: frozenset[str] = frozenset()


RULES: dict[FaultKind, KindRules] = {
    FaultKind.KILL: KindRules(frozenset({"host"})),
    FaultKind.HANG: KindRules(frozenset({"host"})),
    FaultKind.LOSE: KindRules(frozenset({"host"})),
    FaultKind.CORRUPT: KindRules(frozenset({"host"})),
}

_NEW_FAULT = re.compile(r"^\s*[A-Za-z][\w-]*:")


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    step: int
    args: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def host(self) -> int:
        return int(self.args["host"])

    def __str__(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.kind}:{args}@step={self.step}"


def _split_faults(spec: str) -> list[str]:
    faults: list[str] = []
    for token in spec.split(","):
        if faults and not _NEW_FAULT.match(token):
            faults[-1] += "," + token
        else:
            faults.append(token)
    return [f.strip() for f in faults]


def _parse_one(text: str) -> Fault:
    where = f"--chaos: fault '{text}'"
    kind_text, sep, rest = text.partition(":")
    if not sep:
        raise UserError(f"{where}: expected KIND:host=H@step=S")
    try:
        kind = FaultKind(kind_text.strip().lower())
    except ValueError:
        known = ", ".join(k.value for k in FaultKind)
        raise UserError(f"{where}: unknown fault kind '{kind_text}' (known: {known})") from None
    arg_text, at, trigger = rest.rpartition("@")
    if not at:
        raise UserError(f"{where}: missing '@step=S' (when the fault fires)")
    key, eq, value = trigger.partition("=")
    if key.strip() != "step" or not eq or not value.strip().isdigit():
        raise UserError(f"{where}: the trigger must be '@step=S' with S a whole number, not '@{trigger}'")
    step = int(value)
    if step < 1:
        raise UserError(f"{where}: step must be at least 1")
    args: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in arg_text.split(","))):
        name, eq, val = item.partition("=")
        if not eq:
            name, val = "value", item
        if not val.strip():
            raise UserError(f"{where}: argument '{name}' has no value")
        if name.strip() in args:
            raise UserError(f"{where}: argument '{name}' given twice")
        args[name.strip()] = val.strip()
    rules = RULES[kind]
    missing = rules.required - args.keys()
    if missing:
        raise UserError(f"{where}: missing {', '.join(sorted(missing))}=...")
    unknown = args.keys() - rules.required - rules.optional
    if unknown:
        raise UserError(f"{where}: unknown argument(s) {', '.join(sorted(unknown))} for {kind}")
    if "host" in args and not args["host"].isdigit():
        raise UserError(f"{where}: host must be a host index (0, 1, ...), not '{args['host']}'")
    return Fault(kind, step, args)


def parse_chaos(spec: str | None) -> list[Fault]:
    """Parse a chaos spec; raise UserError naming the fault and what is wrong."""
    if spec is None or not spec.strip():
        return []
    return [_parse_one(text) for text in _split_faults(spec)]


def check_hosts(faults: list[Fault], hosts: int) -> None:
    for fault in faults:
        if "host" in fault.args and fault.host >= hosts:
            raise UserError(
                f"--chaos: fault '{fault}' names host {fault.host}, but the job has {hosts} hosts "
                f"(0..{hosts - 1})"
            )
        if fault.kind is FaultKind.LOSE and fault.host == 0:
            raise UserError(
                f"--chaos: fault '{fault}': host 0 runs the job's coordination leader, and leader "
                "hand-over is not supported yet; lose another host"
            )

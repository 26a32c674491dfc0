"""Fault injection specs: `kill:host=1@step=30,hang:host=0@step=60`.

Shared by tests and users (`--chaos`). A spec is a comma-separated list of faults, each
`KIND:ARGS@step=S`; ARGS are `key=value` pairs (or a bare value) separated by commas, so a fault may
carry several (`slow:host=2,factor=2@step=30`): a comma starts a new fault only when what follows
looks like `KIND:`. Each fault fires exactly once: a host fault the first time its host reaches step S,
a job fault (`spare:+1@step=80`, no host) the first time the job reaches step S.

Most kinds aim at one host (`Fault.targets_host`); `spare` aims at the job. `Fault.host` refuses a
hostless fault rather than invent a host index: code that picks the faults of one host uses
`Fault.aimed_at(host)`, which is simply False for a job fault.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum

from slicekeeper.errors import UserError
from slicekeeper.policy.events import FaultKind


class ChaosKind(StrEnum):
    KILL = "kill"
    """SIGKILL of the workload process."""
    HANG = "hang"
    """The workload stays alive but stops making progress (SIGSTOP): as step S begins, or with
    `at=collective` once its own work of step S is done (inside the step's collective, where the
    other hosts wait too: `hang:host=H,at=collective@step=S`)."""
    LOSE = "lose"
    """The host is gone for good: supervisor and workload killed, its local disk (local tier and the
    peer replicas it held) deleted. A spare must take over its identity."""
    CORRUPT = "corrupt"
    """Bytes flipped in the host's newest committed local checkpoint once its copies to the other
    tiers are done (a corruption at rest); noticed at the next restore."""
    SLOW = "slow"
    """`slow:host=H,factor=F@step=S`: the machine serving host H does its work F times slower (F > 1)
    from step S on, for as long as that machine serves, across in-job restarts. Slowness belongs to
    the machine, not the host index: a spare that later takes over host H runs at normal speed (the
    fault has fired; a host replaced before it reached step S hands the unfired fault on, as usual)."""
    CRASH_SUPERVISOR = "crash-supervisor"
    """The host's supervisor process dies (SIGKILL), its workload with it; the machine is intact, so
    its disk keeps the local tier and the peer replicas it held. Locally the runtime restarts the
    supervisor on the same machine, as a kubelet restarts a container; when the host led the job, a
    leader is elected again meanwhile."""
    PARTITION = "partition"
    """`partition:host=H[,seconds=T]@step=S`: the machine serving host H stops passing packets, both
    ways, to and from every other machine, without closing a connection (no FIN, no reset): a silent
    partition, for T seconds (then it heals and the host comes back) or for good. Its processes run
    on. Locally nftables rules drop its packets (supervisor.host.partition; needs root and `nft`)."""
    MAINTENANCE = "maintenance"
    """`maintenance:host=H,notice=N@step=S`: the machine serving host H is announced for maintenance
    (as GKE's node label or Compute Engine's maintenance event announce it) N seconds ahead: its
    supervisor hears of it at step S and tells the leader; N seconds later the machine goes, processes
    and disk, as `lose` (unless it was replaced and gave its host up before)."""
    PREEMPT = "preempt"
    """`preempt:host=H,grace=G@step=S`: the machine serving host H is preempted: its supervisor gets
    SIGTERM at step S (as a pod deleted with its grace period) and, G seconds later, the machine goes,
    as `lose`."""
    SPARE = "spare"
    """`spare:+N@step=S`: N new spare machines join the job when the job reaches step S (capacity
    returned, e.g. after an elastic scale-down). Aims at no host."""

    @property
    def disruptive(self) -> bool:
        """Whether the fault stops the workload by itself, so that a detection can be attributed to
        it: corrupt waits for the next restore, slow only slows (the straggler detector's business,
        not the hang detector's), spare adds capacity."""
        return self in {
            ChaosKind.KILL,
            ChaosKind.HANG,
            ChaosKind.LOSE,
            ChaosKind.CRASH_SUPERVISOR,
            ChaosKind.PARTITION,
            ChaosKind.MAINTENANCE,
            ChaosKind.PREEMPT,
        }

    @property
    def detected_as(self) -> FaultKind | None:
        """The fault kind (slicekeeper.policy.FaultKind) the job is expected to detect this injected
        fault as: the one vocabulary of the wire, the job's memory and the report. None: nothing stops
        by itself (corrupt shows at the next restore, as a restore from another copy; spare adds
        capacity)."""
        return _DETECTED_AS.get(self)


_DETECTED_AS = {
    ChaosKind.KILL: FaultKind.CRASH,
    ChaosKind.HANG: FaultKind.HANG,
    ChaosKind.LOSE: FaultKind.HOST_LOST,
    ChaosKind.CRASH_SUPERVISOR: FaultKind.CRASH,
    ChaosKind.SLOW: FaultKind.STRAGGLER,
    ChaosKind.PARTITION: FaultKind.HOST_LOST,
    ChaosKind.MAINTENANCE: FaultKind.ANNOUNCED_LOSS,
    ChaosKind.PREEMPT: FaultKind.ANNOUNCED_LOSS,
}


BEGIN, COLLECTIVE = "begin", "collective"
"""Where in its step a fault fires (`Fault.at`)."""

_BARE = "value"
"""The argument name a bare value (`+1` in `spare:+1@step=80`) is stored under."""

_SPARE_COUNT = re.compile(r"^\+([0-9]+)$")


@dataclass(frozen=True)
class KindRules:
    required: frozenset[str]
    optional: frozenset[str] = frozenset()


RULES: dict[ChaosKind, KindRules] = {
    ChaosKind.KILL: KindRules(frozenset({"host"})),
    ChaosKind.HANG: KindRules(frozenset({"host"}), frozenset({"at"})),
    ChaosKind.LOSE: KindRules(frozenset({"host"})),
    ChaosKind.CORRUPT: KindRules(frozenset({"host"})),
    ChaosKind.SLOW: KindRules(frozenset({"host", "factor"})),
    ChaosKind.CRASH_SUPERVISOR: KindRules(frozenset({"host"})),
    ChaosKind.PARTITION: KindRules(frozenset({"host"}), frozenset({"seconds"})),
    ChaosKind.MAINTENANCE: KindRules(frozenset({"host", "notice"})),
    ChaosKind.PREEMPT: KindRules(frozenset({"host", "grace"})),
    ChaosKind.SPARE: KindRules(frozenset({_BARE})),
}

_NEW_FAULT = re.compile(r"^\s*[A-Za-z][\w-]*:")


@dataclass(frozen=True)
class Fault:
    kind: ChaosKind
    step: int
    args: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def targets_host(self) -> bool:
        """True for a fault aimed at one host (all kinds but `spare`, which aims at the job)."""
        return "host" in self.args

    @property
    def host(self) -> int:
        """The host index the fault is aimed at; ValueError for a job fault (see `targets_host`)."""
        if not self.targets_host:
            raise ValueError(f"chaos fault '{self}' aims at no host (check Fault.targets_host first)")
        return int(self.args["host"])

    def aimed_at(self, host: int | None) -> bool:
        """Whether this fault is one of `host`'s; False for a job fault and for `host` None (a spare
        that has no host identity yet)."""
        return host is not None and self.targets_host and self.host == host

    @property
    def factor(self) -> float:
        """How many times slower a `slow` fault makes its host's work (> 1)."""
        if self.kind is not ChaosKind.SLOW:
            raise ValueError(f"chaos fault '{self}' has no slowdown factor (only slow faults do)")
        return float(self.args["factor"])

    @property
    def at(self) -> str:
        """Where in step S the fault fires: "begin" (as it begins), or "collective" (a hang, once the
        host's own work of the step is done)."""
        return self.args.get("at", BEGIN)

    @property
    def seconds(self) -> float | None:
        """How long a `partition` lasts before it heals (None: for good)."""
        if self.kind is not ChaosKind.PARTITION:
            raise ValueError(f"chaos fault '{self}' has no duration (only partition faults do)")
        return float(self.args["seconds"]) if "seconds" in self.args else None

    @property
    def warning(self) -> float:
        """How many seconds ahead a `maintenance` (its notice) or `preempt` (its grace) is announced."""
        if self.kind is ChaosKind.MAINTENANCE:
            return float(self.args["notice"])
        if self.kind is ChaosKind.PREEMPT:
            return float(self.args["grace"])
        raise ValueError(f"chaos fault '{self}' is not announced (only maintenance and preempt are)")

    @property
    def count(self) -> int:
        """How many spare machines a `spare` fault adds (>= 1)."""
        if self.kind is not ChaosKind.SPARE:
            raise ValueError(f"chaos fault '{self}' adds no spares (only spare faults do)")
        match = _SPARE_COUNT.match(self.args[_BARE])
        assert match is not None, "validated by parse_chaos"
        return int(match.group(1))

    def __str__(self) -> str:
        args = ",".join(v if k == _BARE else f"{k}={v}" for k, v in self.args.items())
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
        kind = ChaosKind(kind_text.strip().lower())
    except ValueError:
        known = ", ".join(k.value for k in ChaosKind)
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
            name, val = _BARE, item
        if not val.strip():
            raise UserError(f"{where}: argument '{name}' has no value")
        if name.strip() in args:
            what = "more than one bare value" if name == _BARE else f"argument '{name}' given twice"
            raise UserError(f"{where}: {what}")
        args[name.strip()] = val.strip()
    rules = RULES[kind]
    missing = rules.required - args.keys()
    if _BARE in missing:
        raise UserError(f"{where}: missing the value (e.g. {kind}:+1@step=S)")
    if missing:
        raise UserError(f"{where}: missing {', '.join(sorted(missing))}=...")
    unknown = args.keys() - rules.required - rules.optional
    if unknown:
        names = ", ".join(
            f"a bare value '{args[_BARE]}'" if name == _BARE else name for name in sorted(unknown)
        )
        raise UserError(f"{where}: unknown argument(s) {names} for {kind}")
    if "host" in args and not args["host"].isdigit():
        raise UserError(f"{where}: host must be a host index (0, 1, ...), not '{args['host']}'")
    if "factor" in args:
        _check_factor(where, args["factor"])
    for name in ("seconds", "notice", "grace"):
        if name in args:
            _check_seconds(where, args[name], name)
    if args.get("at", BEGIN) not in (BEGIN, COLLECTIVE):
        raise UserError(f"{where}: at must be {BEGIN} or {COLLECTIVE}, not '{args['at']}'")
    if kind is ChaosKind.SPARE:
        match = _SPARE_COUNT.match(args[_BARE])
        if match is None or int(match.group(1)) < 1:
            raise UserError(
                f"{where}: expected spare:+N@step=S with N a whole number of new spares >= 1, "
                f"not '{args[_BARE]}'"
            )
    return Fault(kind, step, args)


def _check_factor(where: str, text: str) -> None:
    try:
        factor = float(text)
    except ValueError:
        raise UserError(f"{where}: factor must be a number greater than 1, not '{text}'") from None
    if not math.isfinite(factor) or factor <= 1.0:
        raise UserError(
            f"{where}: factor must be a finite number greater than 1 (how many times slower), not '{text}'"
        )


def _check_seconds(where: str, text: str, name: str = "seconds") -> None:
    try:
        seconds = float(text)
    except ValueError:
        raise UserError(f"{where}: {name} must be a number of seconds greater than 0, not '{text}'") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UserError(f"{where}: {name} must be a finite number greater than 0, not '{text}'")


def parse_chaos(spec: str | None) -> list[Fault]:
    """Parse a chaos spec; raise UserError naming the fault and what is wrong."""
    if spec is None or not spec.strip():
        return []
    return [_parse_one(text) for text in _split_faults(spec)]


def check_hosts(faults: list[Fault], host_count: int) -> None:
    for fault in faults:
        if fault.targets_host and fault.host >= host_count:
            raise UserError(
                f"--chaos: fault '{fault}' names host {fault.host}, but the job has {host_count} hosts "
                f"(0..{host_count - 1})"
            )

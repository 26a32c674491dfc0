"""The job's memory: what a job has been through and what it holds, as one value, and its journal.

A leader keeps two kinds of state. Connections, timers and tasks belong to its process and die with
it. Everything else is the job's memory: its state and restart generation, the restarts and the
budget they used, the faults fired and what became of them, every detection and recovery, the
persistent checkpoints committed. The report is made of it, and a leader that takes over must carry
it on unchanged (a leader loss must never reset a budget, or a crash loop escapes its limit by
killing the leader). So it lives here, apart from the leader's machinery, as plain data that converts
to JSON and back (`to_json`, `from_json`): a value that can be written down, sent and restored.

The policy's own memory (decisions, budgets used), the job's world (active slices, its history) and
the straggler scores are kept by their own modules; the leader writes them down next to this one, as
the journal (`JournalWriter`): before every command, on a few members (write-ahead), as the change
from the journal before it.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader import journal_delta
from slicekeeper.supervisor.leader.restart_state import JobState, RestartState

from slicekeeper.chaos import ChaosKind
from slicekeeper.policy.events import FaultKind


@dataclass
class FaultRecord:
    """An injected fault and what the job made of it (times are Unix seconds)."""

    kind: ChaosKind
    host: int
    step: int
    fired_at: float
    generation: int
    """The generation the fault fired in; only a detection in that generation is its detection."""
    detected_at: float | None = None
    detected_as: FaultKind | None = None
    resumed_at: float | None = None
    """First step completed after the restart it caused."""
    productive_at: float | None = None
    """First step completed beyond the job's high-water mark after that restart."""
    high_water_at_detection: int = 0
    detected_in_generation: int = -1
    spec: str = ""
    """The fault as written in --chaos, so that a spare never fires a fault its host already fired."""
    disruptive: bool = True
    """False for faults that stop nothing by themselves (corrupt): no detection is theirs."""
    detail: str = ""

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> FaultRecord:
        detected_as = record.get("detected_as")
        return cls(
            **{
                **record,
                "kind": ChaosKind(record["kind"]),
                "detected_as": FaultKind(detected_as) if detected_as is not None else None,
            }
        )

    @property
    def awaiting_resume(self) -> bool:
        """Detected, and the job has not yet trained beyond where it stood then."""
        return self.detected_in_generation >= 0 and self.productive_at is None


@dataclass
class Detection:
    kind: FaultKind
    host: int
    generation: int
    detected_at: float
    detail: str
    restore_step: int | None = None


@dataclass
class JobMemory:
    """See the module docstring. Sets are of steps or hosts; lists are in the order things happened."""

    started_at: float
    restart: RestartState = field(default_factory=RestartState)
    """The restart state machine's state (leader.restart_machine), written by its driver alone
    (leader.generations): the job's state and generation are its phase and generation."""
    high_water: int = 0
    """The furthest step any generation completed."""
    restarts: Counter[str] = field(default_factory=Counter)
    """Stops of the job, by the kind of fault (or planned change) that caused them."""
    stop_cause: dict[str, Any] | None = None
    """What stopped the running generation (kind, host, time, the job's high-water mark then)."""
    faults: list[FaultRecord] = field(default_factory=list)
    detections: list[Detection] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    """One entry per start from a checkpoint: what stopped the job, what every host held, which step
    was restored and how many steps are executed again."""
    restores: list[dict[str, Any]] = field(default_factory=list)
    """One entry per host and restore: the step and tier staged, and the step its workload loaded."""
    hot_swaps: list[dict[str, Any]] = field(default_factory=list)
    failed_saves: Counter[str] = field(default_factory=Counter)
    job_invalid: set[int] = field(default_factory=set)
    """Steps no host may restore (a restore of them gave a non-finite loss)."""
    persisted: dict[int, set[int]] = field(default_factory=dict)
    """step -> hosts whose shard of it is uploaded to the persistent tier (not yet committed)."""
    persistent_committed: set[int] = field(default_factory=set)
    persistent_owners: dict[int, set[int]] = field(default_factory=dict)
    """Committed persistent step -> hosts whose shard it holds (the world of that step)."""
    persistent_commits: list[dict[str, Any]] = field(default_factory=list)
    """Each persistent step committed, with its time."""
    leader_changes: list[dict[str, Any]] = field(default_factory=list)
    """Each hand-over: when, the term, from which host and machine to which, how long the job had no
    leader (supervisor.leader.election)."""

    def __post_init__(self) -> None:
        self._resume_pending = True
        """A fault may await the job's resumption: False once `progressed` found none, so that a
        step's report does not scan the job's whole history of faults (`detected` sets it again)."""

    @property
    def state(self) -> JobState:
        return self.restart.phase

    @property
    def generation(self) -> int:
        return self.restart.generation

    @property
    def failure_reason(self) -> str | None:
        return self.restart.failure_reason

    @property
    def restarts_without_progress(self) -> int:
        return self.restart.restarts_without_progress

    def detected(self, record: FaultRecord, generation: int) -> None:
        """`record`'s fault was detected in `generation`, the job at its high-water mark."""
        record.high_water_at_detection = self.high_water
        record.detected_in_generation = generation
        self._resume_pending = True

    def awaiting_resume(self) -> list[FaultRecord]:
        return [record for record in self.faults if record.awaiting_resume]

    def progressed(self, step: int, now: float) -> bool:
        """A step of the running generation completed: faults detected earlier note when the job
        trained again and when it went beyond where it stood. True when one became productive."""
        productive = False
        awaiting = self.awaiting_resume() if self._resume_pending else []
        self._resume_pending = bool(awaiting)
        for record in awaiting:
            if self.generation <= record.detected_in_generation:
                continue  # a step of the generation being torn down
            if record.resumed_at is None:
                record.resumed_at = now
            if record.productive_at is None and step > record.high_water_at_detection:
                record.productive_at = now
                productive = True
        self.high_water = max(self.high_water, step)
        return productive

    def take(self, other: JobMemory) -> None:
        """Become `other` in place (a leader taking over): every part holding this memory sees it.
        What holds this leader's next start is this process's own, and stays."""
        holds = self.restart.holds
        for item in dataclasses.fields(self):
            setattr(self, item.name, getattr(other, item.name))
        self.restart = dataclasses.replace(self.restart, holds=holds)
        self._resume_pending = True

    # --- as data ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        del data["restart"]  # the job's part of it, under the journal's names; the rest is the process's
        data["state"], data["generation"] = self.state.value, self.generation
        data["failure_reason"] = self.failure_reason
        data["restarts_without_progress"] = self.restarts_without_progress
        data["restarts"], data["failed_saves"] = dict(self.restarts), dict(self.failed_saves)
        data["job_invalid"] = sorted(self.job_invalid)
        data["persistent_committed"] = sorted(self.persistent_committed)
        for name in ("persisted", "persistent_owners"):
            data[name] = {str(step): sorted(hosts) for step, hosts in getattr(self, name).items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobMemory:
        known = {f.name for f in dataclasses.fields(cls)} - {"restart"} | set(RESTART_FIELDS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"job memory: unknown field(s) {', '.join(unknown)}")
        values = {name: value for name, value in data.items() if name not in RESTART_FIELDS}
        values["restarts"], values["failed_saves"] = Counter(data["restarts"]), Counter(data["failed_saves"])
        values["restart"] = RestartState(
            phase=JobState(data["state"]),
            generation=data["generation"],
            restarts=sum(values["restarts"].values()),
            restarts_without_progress=data["restarts_without_progress"],
            failure_reason=data["failure_reason"],
        )
        values["faults"] = [FaultRecord.from_json(record) for record in data["faults"]]
        values["detections"] = [
            Detection(**{**detection, "kind": FaultKind(detection["kind"])})
            for detection in data["detections"]
        ]
        values["job_invalid"] = set(data["job_invalid"])
        values["persistent_committed"] = set(data["persistent_committed"])
        for name in ("persisted", "persistent_owners"):
            values[name] = {int(step): set(hosts) for step, hosts in data[name].items()}
        return cls(**values)


RESTART_FIELDS = ("state", "generation", "failure_reason", "restarts_without_progress")
"""The journal's names for the job's part of the restart state (`JobMemory.restart`)."""

JOURNAL_REPLICAS = 5
"""Members the journal is written on: the leader's successor, whoever it is, finds it on one of them
(they are spread over the job's slices, so losing a slice, the leader's included, leaves others)."""


class JournalMembers(Protocol):
    """What the journal writer needs of the leader's members (supervisor.leader.members.Members)."""

    writers: dict[int, Any]
    leading: Callable[[], bool]

    def live(self) -> set[int]: ...

    async def send(self, host: int, message: messages.Message) -> None: ...


class JournalWriter:
    """Writes the journal down on its replicas, before the command it leads to (write-ahead), so a
    leader taking over carries on from there, never from before a decision already acted on.

    The replicas are `JOURNAL_REPLICAS` live members spread over the slices (every member of a job
    that small), kept for as long as they live. Each is sent the journal whole once, then only the
    change from the journal before it (supervisor.leader.journal_delta): what a command costs does
    not grow with the job's history or its size. A member that is no replica holds no journal."""

    def __init__(
        self,
        members: JournalMembers,
        snapshot: Callable[[], dict[str, Any]],
        slice_of: Callable[[int], int] = lambda host: host,
    ) -> None:
        self._members = members
        self._snapshot = snapshot
        self._slice_of = slice_of
        self.seq = 0
        """Journals written so far by this job's leaders (a leader taking over goes on counting): a
        member keeps the one with the highest number."""
        self.replicas: list[int] = []
        self._written: dict[str, Any] | None = None
        """The journal as last written (what a change is made against)."""
        self._holding: dict[int, tuple[object, int]] = {}
        """replica -> its connection, and the seq of the journal written on it there."""

    async def write(self) -> None:
        if not self._members.leading():
            return  # fenced: nothing is written, so nothing is held that a change could build on
        journal = json.loads(json.dumps(self._snapshot()))  # as a replica reads it (keys are strings)
        previous, self._written = self._written, journal
        self.seq += 1
        whole = messages.Journal(seq=self.seq, journal=journal)
        change = None if previous is None else journal_delta.diff(previous, journal)
        self.replicas = self._choose(self._members.live())
        for host in self.replicas:
            connection = self._members.writers.get(host)
            if change is not None and self._holding.get(host) == (connection, self.seq - 1):
                message = messages.Journal(seq=self.seq, base=self.seq - 1, change=change)
            else:
                message = whole
            self._holding[host] = (connection, self.seq)
            await self._members.send(host, message)

    def _choose(self, live: set[int]) -> list[int]:
        """The replicas kept while they live, and others from slices no replica is on."""
        kept = [host for host in self.replicas if host in live]
        wanted = min(JOURNAL_REPLICAS, len(live))
        if len(kept) >= wanted:
            return kept[:wanted]
        taken = {self._slice_of(host) for host in kept}
        firsts: dict[int, int] = {}
        for host in sorted(live):
            firsts.setdefault(self._slice_of(host), host)
        spread = [host for slice_index, host in sorted(firsts.items()) if slice_index not in taken]
        needed = wanted - len(kept)
        if spread:
            stride = max(1, len(spread) // needed)
            kept += spread[::stride][:needed]
        others = [host for host in sorted(live) if host not in kept]
        return kept + others[: wanted - len(kept)]


def received(held: messages.Journal | None, journal: messages.Journal) -> messages.Journal | None:
    """What a member holds once `journal` is written on it: that journal, or the one it held with the
    change applied (to the journal held, in place: a journal of a long job is large, and the member
    keeps one); a change made against another journal than the one held leaves it as it was."""
    if journal.change is None:
        return journal
    if held is None or held.seq != journal.base:
        return held
    return messages.Journal(
        seq=journal.seq, term=journal.term, journal=journal_delta.apply(held.journal, journal.change)
    )

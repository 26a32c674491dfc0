"""The leader's decision-maker: typed events in, the remediation policy's decisions out, recorded.

The leader sees raw messages (a member's fault report, a dropped connection, per-host step timings, a
spare registering); this module turns them into the policy API's typed events, asks the policy engine
(the user's hooks, the default escalation ladder as fallback) what to do with the job's current facts,
and keeps what the report and the dry-run replay need: every decision with its source, the stragglers
found, the scale events, and an event log (`policy-events.jsonl`) of event, context and decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.leader.members import HostStatus
from slicekeeper.supervisor.leader.world import JobWorld
from slicekeeper.supervisor.signals.straggler import Finding, StragglerDetector

from slicekeeper import policy
from slicekeeper.policy.engine import PolicyEngine
from slicekeeper.policy.events import FaultKind
from slicekeeper.policy.replay import append_to_log


class Decisions:
    def __init__(
        self,
        engine: PolicyEngine,
        world: JobWorld,
        *,
        detector: StragglerDetector | None = None,
        events_path: Path | None = None,
        leading: Callable[[], bool] = lambda: True,
        status: Mapping[int, HostStatus] | None = None,
    ) -> None:
        """`status`: the leader's view of each host (a straggler's record names the machine serving
        it now)."""
        self._status: Mapping[int, HostStatus] = status if status is not None else {}
        self.engine = engine
        self.world = world
        self.detector = detector or StragglerDetector()
        self.events_path = events_path
        self._leading = leading
        """Whether the leader still surely holds the job's lease: a fenced one appends to no log."""
        self.records: list[dict[str, Any]] = []
        """Every decision, with its event, source and reason."""
        self.stragglers: list[dict[str, Any]] = []
        self.scale_events: list[dict[str, Any]] = []

    # --- as data ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything this decision-maker remembers, as JSON (see `carry_on`), but the straggler
        detector's windows: they change at every step of every host (in the journal, every command
        would cost a line per host), and a leader taking over needs none: every hand-over restarts
        the job (the old leader's host is lost, or its supervisor restarted with its workload), and a
        restart starts the windows afresh (`new_world`). The hosts found straggling are written: a leader
        taking over without a restart does not decide on them again."""
        return {
            "engine": self.engine.state(),
            "stragglers_flagged": sorted(self.detector.flagged),
            "decisions": [dict(d) for d in self.records],
            "stragglers": [dict(s) for s in self.stragglers],
            "scale_events": [dict(e) for e in self.scale_events],
        }

    def carry_on(self, state: dict[str, Any]) -> None:
        """Continue where another leader's Remediation left off: the policy's history and budgets,
        the records the report lists, the hosts found straggling."""
        self.engine.carry_on(state["engine"])
        self.detector.carry_on_flagged(self.world.hosts, state.get("stragglers_flagged", ()))
        self.records = [dict(d) for d in state["decisions"]]
        self.stragglers = [dict(s) for s in state["stragglers"]]
        self.scale_events = [dict(e) for e in state["scale_events"]]

    # --- raw messages to typed events ---------------------------------------------------------
    @staticmethod
    def fault_event(host: int, fault: messages.Fault, step: int, generation: int) -> policy.Event:
        """A member's `fault` report (about `host`: the culprit a hang was put down to) as the policy
        sees it."""
        kind, detail, t = fault.kind, fault.detail, fault.t
        if kind is FaultKind.HANG:
            return policy.Hang(
                t=t,
                step=step,
                generation=generation,
                host=host,
                silent_seconds=fault.silent_seconds,
                detail=detail,
            )
        if kind.event_kind is policy.EventKind.CHECKPOINT_INVALID:
            return policy.CheckpointInvalid(
                t=t,
                step=step,
                generation=generation,
                host=host,
                checkpoint_step=fault.invalid_step,
                reason=kind,
                detail=detail,
            )
        return policy.Crash(
            t=t,
            step=step,
            generation=generation,
            host=host,
            exit_code=fault.exit_code,
            signal=fault.signal,
            detail=detail,
        )

    # --- deciding ------------------------------------------------------------------------------
    def decide(
        self, event: policy.Event, *, spares: int, idle: set[int], step: int, generation: int
    ) -> policy.Decision:
        """Ask the policy (blocking up to its hook time limit: call it from a worker thread; the
        engine takes one decision at a time)."""
        decision, context = self.engine.decide(
            event,
            now=time.time(),
            step=step,
            generation=generation,
            spares=spares,
            scores=self.detector.scores(),
            world=self.world.for_policy(idle, spares),
            stragglers=tuple(sorted(self.detector.flagged)),
        )
        self.records.append(
            {
                "t": decision.t,
                "step": step,
                "generation": generation,
                "event": event.to_json(),
                "action": decision.action.to_json(),
                "source": decision.source.value,
                "reason": decision.reason,
            }
        )
        if self.events_path is not None and self._leading():
            append_to_log(self.events_path, decision, context)
        return decision

    # --- stragglers ----------------------------------------------------------------------------
    def observe(self, host: int, step: int, work: float | None, *, core: int | None = None) -> list[Finding]:
        """A host's own work in a step (`core`: the core it ran on, in local mode); returns the hosts
        newly found straggling (with the machine serving each, for the report)."""
        findings = self.detector.observe(host, step, work, core=core)  # each host once per reset
        for finding in findings:
            self.stragglers.append(
                {
                    "host": finding.host,
                    "score": round(finding.score, 3),
                    "step": finding.step,
                    "t": time.time(),
                    "machine": self._machine_of(finding.host),
                }
            )
        return findings

    def _machine_of(self, host: int) -> str:
        status = self._status.get(host)
        return status.machine if status is not None else ""

    def new_world(self) -> None:
        """A generation starts: timings of the previous world (and a replaced machine's) are void."""
        self.detector.reset(self.world.hosts)

    def scaled(self, kind: str, before: list[int], step: int, generation: int, reason: str) -> None:
        self.scale_events.append(
            {
                "t": time.time(),
                "kind": kind,
                "step": step,
                "generation": generation,
                "from_slices": before,
                "to_slices": list(self.world.active),
                "from_hosts": len(self.world.shape.hosts_in(before)),
                "to_hosts": len(self.world.hosts),
                "reason": reason,
            }
        )

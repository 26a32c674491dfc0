"""The job's whole memory as one JSON value: what a leader writes down and a successor carries on.

Three parts of the leader hold what a successor needs: the job's memory (leader.journal.JobMemory),
its world (leader.world: which slices take part) and the policy's own state with the decisions
taken (leader.decisions). `JobJournal` names the three once, for the journal's writer (its
snapshot) and for a leader taking over (`carry_on`), so that neither reaches back into the leader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slicekeeper.supervisor.leader.decisions import Decisions
from slicekeeper.supervisor.leader.journal import JobMemory
from slicekeeper.supervisor.leader.world import JobWorld


@dataclass(frozen=True)
class JobJournal:
    memory: JobMemory
    world: JobWorld
    decisions: Decisions

    def state(self) -> dict[str, Any]:
        """All the job's memory as JSON: what a leader taking over needs to carry on (`carry_on`)."""
        return {
            "memory": self.memory.to_json(),
            "world": self.world.state(),
            "remediation": self.decisions.state(),
        }

    def carry_on(self, journal: dict[str, Any]) -> None:
        """Take over the memory another leader of this job wrote down (`journal`)."""
        self.memory.take(JobMemory.from_json(journal["memory"]))
        self.world.carry_on(journal["world"])
        self.decisions.carry_on(journal["remediation"])

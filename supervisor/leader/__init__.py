"""The leader of a job, in parts: one job each (see docs/architecture.md, "The control plane").

leader.py        the server: members' reports to the part whose job each is
members.py       the connections, and what the leader knows of each host
journal.py       the job's memory as a value, and the journal written on the members
generations.py   the restart state machine: stop all, agree a restore step, start all
restart_rule.py  when a fault may restart the job and when it fails it
remediation.py   fault -> policy event -> decision -> action
decisions.py     the policy asked, its decisions and the straggler detector recorded
capacity.py      where a replacement machine comes from: spares locally, new pods in a cluster
checkpoints.py   what every host and tier holds, and the restore plan
status.py        the status lines, the TrainingJob status, the job summary
world.py         which slices take part in the job now: scale-down and back up by whole slices
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slicekeeper.supervisor.leader.leader import Leader

__all__ = ["Leader"]


def __getattr__(name: str) -> Any:
    """`Leader`, imported when first asked for: `slicekeeper run` reads a few of this folder's
    modules (settings, the lease file) and never runs a leader itself."""
    if name == "Leader":
        from slicekeeper.supervisor.leader.leader import Leader

        return Leader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

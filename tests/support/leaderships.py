"""A supervisor's part in the election (supervisor.host.leadership.Leadership) for unit tests: leading
a small job of fake members when elected, quiet, on 127.0.0.1."""

from __future__ import annotations

from slicekeeper.supervisor.host.leadership import Leadership
from slicekeeper.supervisor.host.who_leads import AskCandidates
from slicekeeper.supervisor.leader import Leader
from slicekeeper.supervisor.leader.election import Election, Holder
from slicekeeper.supervisor.leader.settings import LeaderSettings

from slicekeeper.shape import JobShape
from tests.support.fake_members import coordinator


def leadership_in(
    election: Election,
    own: Holder,
    *,
    candidate: bool,
    first: bool,
    hosts: int = 2,
    ask: AskCandidates | None = None,
) -> Leadership:
    """`own` in `election` (`candidate`: it may lead; `first`: it takes the lease at once), leading a
    one-slice job of `hosts` hosts when elected; `ask`: how it learns the lease if not a candidate."""
    return Leadership(
        election,
        own,
        candidate=candidate,
        first=first,
        new_leader=lambda term, leading: Leader(LeaderSettings(JobShape(1, hosts), 3), coordinator),
        journal=lambda: None,
        bind="127.0.0.1",
        ask=ask,
        say=lambda text: None,
    )

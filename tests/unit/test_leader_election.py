"""Who leads a job: the lease, its term, and the fence (supervisor/leader/election.py, leader/members.py).

The election is kubernetes' own algorithm run on a lease file locally (the same compare-and-swap a
Lease's resourceVersion gives in a cluster, tests/operator for that): one holder at a time, a holder
that stops renewing replaced after the lease's duration with the next term, and a leader that cannot
be sure it still holds the lease sends nothing.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.leadership import Leadership
from slicekeeper.supervisor.leader.election import (
    LEASE_FILE,
    Election,
    FileLeaseLock,
    Holder,
    Timing,
    local_election,
    read_lease_file,
)
from slicekeeper.supervisor.leader.members import Members
from slicekeeper.supervisor.ports import free_port

from tests.support.fake_members import eventually
from tests.support.leaderships import leadership_in

FAST = Timing(duration=2, renew_deadline=1.5, retry=1)  # type: ignore[arg-type]


def candidate(run_dir, machine: str, host: int) -> Election:
    holder = Holder(machine, host, f"127.0.0.1:{9000 + host}")
    return Election(FileLeaseLock(run_dir / LEASE_FILE, holder.identity()), FAST)


def leadership_on(election: Election, own: Holder, *, candidate: bool) -> Leadership:
    """This test's supervisor in the election (`candidate`: a host's; else a spare's), leading a
    two-host job when elected; the first leader when a candidate."""
    return leadership_in(election, own, candidate=candidate, first=candidate)


def test_an_identity_names_machine_host_address_and_run_and_reads_back():
    holder = Holder("spare-0", 2, "10.0.0.7:8490")
    assert Holder.parse(holder.identity()) == holder
    assert Holder("spare-0", 2, "10.0.0.7:8490") != holder  # another run of the same supervisor
    assert Holder.parse("someone-else") is None


def test_one_holder_at_a_time_and_a_silent_one_is_replaced_with_the_next_term(tmp_path):
    async def scenario() -> None:
        first, second = candidate(tmp_path, "host-0", 0), candidate(tmp_path, "host-1", 1)
        assert await first.step() and first.term == 1
        assert not await second.step()  # held, and renewed: not for the taking
        assert await first.step()  # its last renewal: then it is lost, or paused
        assert not await second.step()  # the renewal seen: the duration counts from now, on its clock
        observed = second.observed()
        assert observed is not None and observed.holder is not None and observed.holder.host == 0
        await asyncio.sleep(FAST.duration + 0.2)
        assert await second.step() and second.term == 2
        assert not await first.step()  # it came back: the lease is no longer its own
        lease = read_lease_file(tmp_path / LEASE_FILE)
        assert lease is not None and lease.holder is not None
        assert (lease.holder.machine, lease.term) == ("host-1", 2)

    asyncio.run(scenario())


def test_a_stale_read_cannot_overwrite_a_newer_record(tmp_path):
    """The compare-and-swap: an update based on a version someone else changed since is refused."""
    path = tmp_path / LEASE_FILE
    a, b = FileLeaseLock(path, "a"), FileLeaseLock(path, "b")
    record = LeaderElectionRecord("a", "2", "t0", "t0")
    assert a.create("", "", record)
    assert b.get("", "")[0] and a.get("", "")[0]
    assert a.update("", "", LeaderElectionRecord("a", "2", "t0", "t1"))  # renewed
    assert not b.update("", "", LeaderElectionRecord("b", "2", "t1", "t1"))  # read before the renewal
    assert json.loads(path.read_text())["holder"] == "a"
    assert b.get("", "")[0] and b.update("", "", LeaderElectionRecord("b", "2", "t1", "t1"))
    assert json.loads(path.read_text())["transitions"] == 1


def test_a_leader_is_sure_of_its_lease_only_within_the_renew_deadline(tmp_path):
    async def scenario() -> None:
        election = local_election(tmp_path, Holder("host-0", 0, "127.0.0.1:1"))
        assert not election.leading()
        assert await election.step()
        renewed = time.monotonic()
        deadline = election.timing.renew_deadline
        assert election.leading(lambda: renewed + deadline - 0.1)
        assert not election.leading(lambda: renewed + deadline + 0.1)  # e.g. paused: it stops acting

    asyncio.run(scenario())


class Recorder:
    """A stand-in for a member's connection: what was written to it."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.transport = None  # not a relay's channel: written to directly

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    async def drain(self) -> None:
        pass


@pytest.mark.parametrize("leading", [True, False])
def test_every_command_carries_the_term_and_a_fenced_leader_sends_nothing(leading):
    async def scenario() -> list[bytes]:
        members = Members(term=3, leading=lambda: leading)
        member, spare = Recorder(), Recorder()
        members.writers[1] = member  # type: ignore[assignment]
        await members.broadcast(messages.Stop(generation=4, kind="crash"))
        await members.send(
            1, messages.Start(generation=5, coordinator="c", restore_step=None, world=[1], rank=0)
        )
        await members.send_to(spare, messages.Assign(host=1, generation=5))  # type: ignore[arg-type]
        await members.send_each([1, 7], messages.Stop(generation=5, kind="crash"))  # 7: no member
        return member.lines + spare.lines

    sent = asyncio.run(scenario())
    if leading:
        assert [messages.command(line).term for line in sent] == [3, 3, 3, 3]
        assert [type(messages.command(line)).__name__ for line in sent[:3]] == ["Stop", "Start", "Stop"]
    else:
        assert sent == []  # the negative control of the fence: nothing at all leaves


def test_a_released_lease_is_taken_at_once_by_the_next_candidate(tmp_path):
    async def scenario() -> None:
        first, second = candidate(tmp_path, "host-0", 0), candidate(tmp_path, "host-1", 1)
        assert await first.step()
        assert not await second.step()  # held
        await first.release()  # its process is ending
        assert not first.leading()
        assert await second.step()  # no need to wait out the duration
        lease = read_lease_file(tmp_path / LEASE_FILE)
        assert lease is not None and lease.holder is not None and lease.holder.machine == "host-1"

    asyncio.run(scenario())


def test_a_leader_taking_a_released_lease_knows_whom_it_replaces_and_since_when(tmp_path):
    async def scenario() -> None:
        first, second = candidate(tmp_path, "host-0", 0), candidate(tmp_path, "host-1", 1)
        assert await first.step()
        assert not await second.step()
        await first.release()
        released = read_lease_file(tmp_path / LEASE_FILE)
        assert released is not None and released.released and released.leader is None  # nobody to follow
        assert released.holder is not None and released.holder.machine == "host-0"
        assert await second.step()
        taken = second.taken_from
        assert taken is not None and taken.holder is not None and taken.holder.machine == "host-0"
        assert abs(taken.renewed_at - time.time()) < 5

    asyncio.run(scenario())


def test_a_supervisor_started_again_releases_the_lease_its_dead_predecessor_held(tmp_path):
    """Only its own machine's predecessor (same machine, same host, another run): a restarted
    supervisor never releases another machine's lease (the negative control)."""

    async def scenario() -> None:
        predecessor = Holder("host-0", 0, "127.0.0.1:9000")
        other = Holder("host-1", 1, "127.0.0.1:9001")
        restarted = Holder("host-0", 0, "127.0.0.1:9000")  # a new incarnation
        lease_path = tmp_path / LEASE_FILE
        held = Election(FileLeaseLock(lease_path, predecessor.identity()), FAST)
        assert await held.step()
        await asyncio.sleep(0.05)
        # Another machine's lease is not its to release.
        bystander = Election(FileLeaseLock(lease_path, other.identity()), FAST)
        assert await bystander.release_predecessor(other) is None
        successor = Election(FileLeaseLock(lease_path, restarted.identity()), FAST)
        released = await successor.release_predecessor(restarted)
        assert released is not None and released.leader == predecessor
        assert await successor.step() and successor.term == 3  # released, then taken: two transitions
        taken = successor.taken_from
        assert taken is not None and taken.holder == predecessor
        assert taken.renewed_at < time.time() - 0.04  # the predecessor's last renewal, not the release
        assert await successor.release_predecessor(restarted) is None  # itself: nothing to release

    asyncio.run(scenario())


def test_a_leader_that_released_the_lease_never_takes_it_back(tmp_path):
    """A released lease is free at once, to anyone but the process that gave it up (its campaign may
    still be running while it ends): the negative control is a fresh candidate, which takes it."""

    async def scenario() -> None:
        leaving = candidate(tmp_path, "host-0", 0)
        assert await leaving.step()
        await leaving.release()
        assert not await leaving.step()  # withdrawn for good
        lease = read_lease_file(tmp_path / LEASE_FILE)
        assert lease is not None and lease.released
        assert await candidate(tmp_path, "host-1", 1).step()

    asyncio.run(scenario())


def test_a_spare_only_watches_until_it_takes_a_host_over_then_it_may_lead(tmp_path):
    """A spare that took host 0 over is a candidate like every host (otherwise hot-swaps would thin the
    candidates out): here the lease is free, and it takes it only once it serves a host."""

    async def scenario() -> None:
        old = local_election(tmp_path, Holder("host-0", 0, "127.0.0.1:1"))
        assert await old.step()
        await old.release()  # nobody leads: free for the taking
        watching = Holder("spare-0", -1, f"127.0.0.1:{free_port()}")
        leadership = leadership_on(local_election(tmp_path, watching), watching, candidate=False)
        campaign = asyncio.create_task(leadership.run())
        await asyncio.sleep(0.6)
        assert leadership.leader is None  # a spare only watches (the negative control)
        serving = Holder("spare-0", 0, watching.address)
        leadership.adopt(local_election(tmp_path, serving), serving, True)
        await eventually(lambda: leadership.leader is not None)
        lease = read_lease_file(tmp_path / LEASE_FILE)
        assert lease is not None and lease.leader == serving
        campaign.cancel()
        assert leadership.leader is not None
        await leadership.leader.close()

    asyncio.run(scenario())


def test_a_leader_whose_renewals_lagged_renews_before_its_last_word_and_a_replaced_one_writes_none(
    tmp_path,
):
    """The job's final status is written once the lease is renewed then and there: renewals that lagged
    behind the renew deadline at the job's end (a loaded machine) do not lose it, and a leader another
    candidate replaced meanwhile is not sure, and writes nothing."""

    async def scenario() -> None:
        own = Holder("host-0", 0, f"127.0.0.1:{free_port()}")
        election = Election(FileLeaseLock(tmp_path / LEASE_FILE, own.identity()), FAST)
        leadership = leadership_on(election, own, candidate=True)
        campaign = asyncio.create_task(leadership.run())
        await eventually(lambda: leadership.leader is not None)
        campaign.cancel()  # no renewal since: they lag
        election.stop_renewing()
        await asyncio.sleep(FAST.renew_deadline + 0.1)
        assert not election.leading()  # time alone says: not sure (the last word would be lost)
        assert await leadership.sure() and election.term == 1
        other = candidate(tmp_path, "host-1", 1)
        assert not await other.step()  # held, and just renewed
        await asyncio.sleep(FAST.duration + 0.2)
        assert await other.step() and other.term == 2  # the next term, elsewhere
        assert not await leadership.sure()
        assert leadership.leader is not None
        await leadership.leader.close()

    asyncio.run(scenario())

"""Few lease readers (issue 41): with relays only a few supervisors read and write the job's lease,
the others ask them who leads (supervisor/host/who_leads.py) and read it only when none answers.

Which hosts are candidates (slicekeeper.shape.JobShape.lease_candidates), a relay port answering who
leads, the newest term among the answers winning, and a supervisor that is not a candidate making no
lease request at all while its candidates answer; its negative control, the same supervisor without
candidates to ask, reads the lease as every supervisor did before.
"""

from __future__ import annotations

import asyncio
import time

from slicekeeper.supervisor.host import who_leads
from slicekeeper.supervisor.host.leadership import Leadership
from slicekeeper.supervisor.host.relay import Relay
from slicekeeper.supervisor.leader.election import LEASE_FILE, Election, FileLeaseLock, Holder, Lease, Timing
from slicekeeper.supervisor.ports import free_port

from slicekeeper.shape import JobShape
from tests.support.leaderships import leadership_in

FAST = Timing(duration=2, renew_deadline=1.5, retry=1)  # type: ignore[arg-type]


def test_candidates_are_host_0_then_first_hosts_of_slices_spread_over_the_job():
    assert JobShape(2, 2).lease_candidates(3) == (0, 2, 1)  # the example: both slices, then a second host
    assert JobShape(64, 4).lease_candidates(3) == (0, 84, 168)  # slices 0, 21, 42: three relay groups
    assert JobShape(1, 2).lease_candidates(5) == (0, 1)  # never more than the job's hosts
    big = JobShape(6250, 4).lease_candidates(5)  # 25,000 hosts
    assert len({JobShape(6250, 4).slice_of(h) for h in big}) == 5 and big[0] == 0


def lease_of(host: int, term: int) -> Lease:
    return Lease(Holder(f"host-{host}", host, f"127.0.0.1:{9000 + host}"), term, time.time())


async def relay_answering(lease: Lease | None) -> tuple[Relay, str]:
    relay = Relay(0)
    relay.lease_seen = lambda: who_leads.seen(lease)
    port = await relay.serve("127.0.0.1")
    return relay, f"127.0.0.1:{port}"


def test_a_relay_port_answers_who_leads_and_the_newest_term_among_candidates_wins():
    async def scenario() -> None:
        old, new = lease_of(0, 1), lease_of(2, 2)
        lagging, current = await relay_answering(old), await relay_answering(new)
        unread, _ = await relay_answering(None), None
        try:
            assert await who_leads.ask(lagging[1], None) == old
            assert await who_leads.ask(unread[1], None) is None  # answered: no lease read yet
            gone = f"127.0.0.1:{free_port()}"
            answered, lease = await who_leads.ask_candidates([gone, lagging[1], current[1]], None)
            assert answered and lease == new
            assert await who_leads.ask_candidates([gone], None) == (False, None)
        finally:
            for relay, _ in (lagging, current, unread):
                await relay.close()

    asyncio.run(scenario())


def supervisor_of(run_dir, host: int, candidates: list[str] | None) -> Leadership:
    """Host `host`'s supervisor in the election, not a candidate: it asks `candidates` (None: it
    reads the lease itself, as every supervisor does without relays)."""
    own = Holder(f"host-{host}", host, f"127.0.0.1:{9000 + host}")
    ask = None if candidates is None else lambda: who_leads.ask_candidates(candidates, None)
    election = Election(FileLeaseLock(run_dir / LEASE_FILE, own.identity()), FAST)
    return leadership_in(election, own, candidate=False, first=False, ask=ask)


def test_a_supervisor_that_is_no_candidate_learns_the_leader_from_them_and_never_reads_the_lease(tmp_path):
    async def scenario(candidates: bool) -> tuple[Lease | None, int]:
        run_dir = tmp_path / str(candidates)
        run_dir.mkdir()
        leader = Election(FileLeaseLock(run_dir / LEASE_FILE, lease_of(0, 1).holder.identity()), FAST)
        assert await leader.step()  # host 0 holds the lease, term 1
        relay, address = await relay_answering(leader.observed())
        member = supervisor_of(run_dir, 1, [address] if candidates else None)
        campaign = asyncio.create_task(member.run())
        try:
            lease = await member.current(timeout=5)
            member.looking = False
            await asyncio.sleep(1.0)  # at rest: its member follows the leader it found
        finally:
            campaign.cancel()
            await relay.close()
        return lease, member.lease_requests

    lease, requests = asyncio.run(scenario(candidates=True))
    assert lease is not None and lease.leader is not None and lease.leader.host == 0 and requests == 0
    # The negative control: with no candidate to ask it reads the lease, and keeps reading it.
    lease, requests = asyncio.run(scenario(candidates=False))
    assert lease is not None and requests >= 3, requests


def test_when_no_candidate_answers_for_a_while_it_reads_the_lease_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(who_leads, "UNANSWERED_SECONDS", 0.5)

    async def scenario() -> tuple[Lease | None, int]:
        leader = Election(FileLeaseLock(tmp_path / LEASE_FILE, lease_of(0, 1).holder.identity()), FAST)
        assert await leader.step()
        member = supervisor_of(tmp_path, 1, [f"127.0.0.1:{free_port()}"])  # no candidate answers
        campaign = asyncio.create_task(member.run())
        try:
            started = time.monotonic()
            lease = await member.current(timeout=5)
            assert time.monotonic() - started >= 0.5  # asked in vain first
        finally:
            campaign.cancel()
        return lease, member.lease_requests

    lease, requests = asyncio.run(scenario())
    assert lease is not None and lease.leader is not None and lease.leader.host == 0 and requests >= 1


def requests_a_second_at_rest(run_dir, timing: Timing, candidates: int = 3) -> float:
    """The lease requests a second of `candidates` candidates once one leads (over 3 s)."""

    async def scenario() -> float:
        leaderships = []
        for host in range(candidates):
            own = Holder(f"host-{host}", host, f"127.0.0.1:{free_port()}")
            election = Election(FileLeaseLock(run_dir / LEASE_FILE, own.identity()), timing)
            leaderships.append(leadership_in(election, own, candidate=True, first=host == 0, hosts=3))
        campaigns = [asyncio.create_task(leadership.run()) for leadership in leaderships]
        try:
            await asyncio.sleep(2.0)  # host 0 leads, the others saw it
            assert [leadership.leader is not None for leadership in leaderships] == [True, False, False]
            before, started = sum(each.lease_requests for each in leaderships), time.monotonic()
            await asyncio.sleep(3.0)
            return (sum(each.lease_requests for each in leaderships) - before) / (time.monotonic() - started)
        finally:
            for campaign in campaigns:
                campaign.cancel()
            for leadership in leaderships:
                leadership.election.stop_renewing()
                if leadership.leader is not None:
                    await leadership.leader.close()

    return asyncio.run(scenario())


def test_at_rest_three_candidates_ask_the_api_server_two_requests_a_retry(tmp_path):
    """CLUSTER_TIMING's rule (a renewal a retry, a read and a write; each other candidate a read; the
    leader's campaign adding nothing to its renewals): 4 requests a retry for 3 candidates, 2 a
    second at the cluster's 2 s retry. Here at a 1 s retry: at most 4 a second (load only slows them).
    The negative control, renewing twice a retry as locally, asks for 6."""
    once = Timing(duration=3, renew_deadline=2, retry=1, renewals_per_retry=1)
    twice = Timing(duration=3, renew_deadline=2, retry=1, renewals_per_retry=2)
    (tmp_path / "once").mkdir(), (tmp_path / "twice").mkdir()
    assert requests_a_second_at_rest(tmp_path / "once", once) <= 4.4
    assert requests_a_second_at_rest(tmp_path / "twice", twice) > 4.4

"""A supervisor's tier copies: replicate and persist after each save, stage back with fallback.

Real replica servers on 127.0.0.1 and a real persistent directory; failures are injected by
unreachable peers and a persistent tier whose uploads fail, as a full disk would make them.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoint_vocabulary import Tier
from slicekeeper.supervisor.checkpoints import save_copies
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.metrics import SupervisorMetrics

from slicekeeper import shard_folder
from slicekeeper.api import CheckpointSpec
from slicekeeper.goodput import GoodputAccountant
from slicekeeper.shape import JobShape
from slicekeeper.shard_folder import Manifest, ShardFile

WAIT = 5.0


def write_step(directory: Path, step: int, payload: bytes = b"weights") -> Path:
    tmp = shard_folder.tmp_dir(directory, step)
    tmp.mkdir(parents=True)
    (tmp / "00000.npy").write_bytes(payload * step)
    shard = ShardFile("params", "00000.npy", shard_folder.sha256_file(tmp / "00000.npy"), len(payload) * step)
    shard_folder.write_manifest(tmp, Manifest(step, (shard,)))
    final = shard_folder.step_dir(directory, step)
    shard_folder.commit(tmp, final)
    return final


class Host:
    """One supervisor's CheckpointTiers with what it reports and logs recorded."""

    def __init__(
        self, root: Path, host: int, spec: CheckpointSpec, persistent: PersistentTier | None
    ) -> None:
        self.reports: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.metrics = SupervisorMetrics(lambda: GoodputAccountant(0.0))
        self.tiers = CheckpointTiers(
            root / f"host-{host}",
            spec,
            shape=JobShape(2, 1),
            persistent=persistent,
            metrics=self.metrics,
            report=self._report,
            log=self.logs.append,
        )
        self.tiers.host = host

    async def _report(self, message: messages.MemberReport) -> None:
        """Recorded as the leader reads it, less the host and time its supervisor stamps."""
        self.reports.append(message.model_dump(mode="json", include={"type", *message.model_fields_set}))

    def failures(self, tier: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "slicekeeper_checkpoint_failures_total", {"tier": tier}
        )
        return value or 0.0


class FullDisk(PersistentTier):
    def upload(self, host: int, folder: Path) -> int:
        raise PersistentTierError(f"{self.location}: cannot write: no space left on device")


def spec(tmp_path: Path, interval: int = 5) -> CheckpointSpec:
    return CheckpointSpec.model_validate(
        {"interval": 5, "persistent": {"uri": str(tmp_path / "persistent"), "interval": interval}}
    )


def run(scenario: Any) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), 3 * WAIT))


def test_a_saved_step_is_replicated_to_the_peer_and_persisted(tmp_path):
    async def scenario():
        persistent = PersistentTier(str(tmp_path / "persistent"), "job/run")
        owner, holder = Host(tmp_path, 0, spec(tmp_path), persistent), Host(tmp_path, 1, spec(tmp_path), None)
        addresses = {0: await owner.tiers.serve("127.0.0.1"), 1: await holder.tiers.serve("127.0.0.1")}
        owner.tiers.start_generation(0, addresses)
        write_step(owner.tiers.local_dir, 5)
        owner.tiers.saved(5)
        await asyncio.wait_for(owner.tiers.drain(), WAIT)
        assert holder.tiers.replicas.steps(0) == [5]
        assert persistent.hosts_uploaded(5) == {0}
        assert {"type": "persisted", "step": 5} in owner.reports
        assert [r["type"] for r in owner.logs] == ["replicated", "persisted"]
        await owner.tiers.close()
        await holder.tiers.close()

    run(scenario)


def test_a_failed_upload_is_reported_counted_and_logged_and_later_saves_go_on(tmp_path):
    async def scenario():
        # Tried once: a disk that is full stays full (tests/unit/test_store_deadlines.py tries again).
        full = FullDisk(str(tmp_path / "persistent"), "job/run", attempts=1)
        host = Host(tmp_path, 0, spec(tmp_path), full)
        await host.tiers.serve("127.0.0.1")
        host.tiers.start_generation(0, {})
        for step in (5, 10):
            write_step(host.tiers.local_dir, step)
            host.tiers.saved(step)
        await asyncio.wait_for(host.tiers.drain(), WAIT)
        invalid = [r for r in host.reports if r["type"] == "checkpoint_invalid"]
        assert [(r["step"], r["tier"], r["reason"]) for r in invalid] == [
            (5, "persistent", "upload failed"),
            (10, "persistent", "upload failed"),
        ]
        assert "no space left" in invalid[0]["detail"]
        assert host.failures("persistent") == 2
        assert [r["type"] for r in host.logs] == ["checkpoint_failed", "checkpoint_failed"]
        await host.tiers.close()

    run(scenario)


def upload_of_a_step_deleted_before_its_copies_ran(tmp_path: Path) -> tuple[Host, PersistentTier]:
    """Step 30 (due for the persistent tier) saved, then deleted by the workload's retention before
    the copies got to it, as when they fall behind on a loaded machine."""

    async def scenario():
        persistent = PersistentTier(str(tmp_path / "persistent"), "job/run")
        host = Host(tmp_path, 0, spec(tmp_path, interval=30), persistent)
        await host.tiers.serve("127.0.0.1")
        host.tiers.start_generation(0, {})
        for step in (25, 30, 35, 40, 45):
            write_step(host.tiers.local_dir, step)
            host.tiers.saved(step)
            shard_folder.retain(host.tiers.local_dir, 3)  # the workload's maxToKeep, before any copy
        assert shard_folder.committed_steps(host.tiers.local_dir) == [35, 40, 45]
        await asyncio.wait_for(host.tiers.drain(), WAIT)
        await host.tiers.close()
        return host, persistent

    return asyncio.run(scenario())


def test_a_step_due_for_the_persistent_tier_is_uploaded_though_retention_deleted_it_first(tmp_path):
    host, persistent = upload_of_a_step_deleted_before_its_copies_ran(tmp_path)
    assert persistent.hosts_uploaded(30) == {0}
    assert {"type": "persisted", "step": 30} in host.reports
    assert not list((host.tiers.local_dir / save_copies.PINNED).glob("**/*"))  # nothing left kept


def test_negative_control_without_keeping_the_due_step_it_is_skipped_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(save_copies.SaveCopies, "_pin", lambda self, generation, step: None)
    host, persistent = upload_of_a_step_deleted_before_its_copies_ran(tmp_path)
    assert persistent.hosts_uploaded(30) == set()
    skipped = [r for r in host.reports if r["type"] == "checkpoint_invalid"]
    assert [(r["step"], r["tier"], r["reason"]) for r in skipped] == [(30, "persistent", "upload skipped")]


def test_an_unreachable_peer_is_a_counted_replication_failure_not_a_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(save_copies, "PUSH_BACKOFF_SECONDS", 0.01)

    async def scenario():
        host = Host(tmp_path, 0, CheckpointSpec(), None)
        await host.tiers.serve("127.0.0.1")
        host.tiers.start_generation(0, {1: "127.0.0.1:9"})  # nothing listens on the discard port
        write_step(host.tiers.local_dir, 10)
        host.tiers.saved(10)
        await asyncio.wait_for(host.tiers.drain(), WAIT)
        assert [(r["tier"], r["reason"]) for r in host.reports] == [("peer", "replication failed")]
        assert host.reports[0]["detail"].endswith(
            f"(try {save_copies.PUSH_ATTEMPTS} of {save_copies.PUSH_ATTEMPTS})"
        )
        assert host.failures("peer") == 1
        await host.tiers.close()

    run(scenario)


async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.mark.parametrize("attempts", [save_copies.PUSH_ATTEMPTS, 1])
def test_a_push_refused_once_is_tried_again_and_replicates(tmp_path, monkeypatch, attempts):
    """The holder's first connection is dropped (a peer restarting, say): the second try gets through.
    Negative control: with one try, the step is not replicated and the failure is said."""
    monkeypatch.setattr(save_copies, "PUSH_BACKOFF_SECONDS", 0.01)
    monkeypatch.setattr(save_copies, "PUSH_ATTEMPTS", attempts)

    async def scenario():
        owner, holder = Host(tmp_path, 0, CheckpointSpec(), None), Host(tmp_path, 1, CheckpointSpec(), None)
        real = (await holder.tiers.serve("127.0.0.1")).rsplit(":", 1)
        connections = []

        async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            if len(connections) == 1:
                writer.transport.abort()  # the first try: dropped
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(real[0], int(real[1]))
            await asyncio.gather(forward(reader, upstream_writer), forward(upstream_reader, writer))

        proxy = await asyncio.start_server(flaky, "127.0.0.1", 0)
        await owner.tiers.serve("127.0.0.1")
        owner.tiers.start_generation(0, {1: f"127.0.0.1:{proxy.sockets[0].getsockname()[1]}"})
        write_step(owner.tiers.local_dir, 10)
        owner.tiers.saved(10)
        await asyncio.wait_for(owner.tiers.drain(), WAIT)
        if attempts > 1:
            assert len(connections) == 2 and owner.reports == []
            assert holder.tiers.replicas.steps(0) == [10]
        else:
            assert len(connections) == 1 and [r["reason"] for r in owner.reports] == ["replication failed"]
            assert holder.tiers.replicas.steps(0) == []
        proxy.close()
        await owner.tiers.close()
        await holder.tiers.close()

    run(scenario)


def test_saves_of_a_generation_being_torn_down_are_not_copied(tmp_path):
    async def scenario():
        owner, holder = Host(tmp_path, 0, CheckpointSpec(), None), Host(tmp_path, 1, CheckpointSpec(), None)
        addresses = {0: await owner.tiers.serve("127.0.0.1"), 1: await holder.tiers.serve("127.0.0.1")}
        owner.tiers.start_generation(3, addresses)
        write_step(owner.tiers.local_dir, 10)
        owner.tiers.saved(10)
        owner.tiers.pause()  # the stop arrives before the copy started
        owner.tiers.start_generation(4, addresses)
        await asyncio.wait_for(owner.tiers.drain(), WAIT)
        assert holder.tiers.replicas.steps(0) == []
        await owner.tiers.close()
        await holder.tiers.close()

    run(scenario)


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_staging_falls_back_from_a_bad_local_copy_to_the_peer_replica(tmp_path, damage):
    async def scenario():
        owner, holder = Host(tmp_path, 0, CheckpointSpec(), None), Host(tmp_path, 1, CheckpointSpec(), None)
        addresses = {0: await owner.tiers.serve("127.0.0.1"), 1: await holder.tiers.serve("127.0.0.1")}
        owner.tiers.start_generation(0, addresses)
        folder = write_step(owner.tiers.local_dir, 10)
        owner.tiers.saved(10)
        await asyncio.wait_for(owner.tiers.drain(), WAIT)
        if damage == "corrupt":
            assert owner.tiers.corrupt_newest() == 10
        else:
            (folder / "00000.npy").unlink()
        sources = [{"tier": "local"}, {"tier": "peer", "holder": 1, "address": addresses[1]}]
        staged = await owner.tiers.stage(10, sources)
        assert staged is not None and (staged.tier, staged.holder) == (Tier.PEER, 1)
        shard_folder.verify(shard_folder.step_dir(owner.tiers.local_dir, 10))  # a good copy again
        invalid = [r for r in owner.reports if r["type"] == "checkpoint_invalid"]
        assert [(r["step"], r["tier"], r["reason"]) for r in invalid] == [(10, "local", "corrupt")]
        assert (owner.tiers.local_dir / "step-00000010.corrupt").is_dir()  # kept for a post-mortem
        await owner.tiers.close()
        await holder.tiers.close()

    run(scenario)


@pytest.mark.parametrize("at_rest", [True, False])
def test_chaos_corrupt_waits_for_the_steps_copies_so_that_the_peer_holds_a_valid_one(tmp_path, at_rest):
    """Chaos `corrupt` fired just after a save, its push still queued: at rest (as the chaos fault
    does it) the peer gets the good bytes first and the restore takes them from it. The negative
    control flips the bytes at once, as chaos did before: the push reads them, refuses them, and the
    step has no valid copy anywhere."""

    async def scenario():
        owner, holder = Host(tmp_path, 0, CheckpointSpec(), None), Host(tmp_path, 1, CheckpointSpec(), None)
        addresses = {0: await owner.tiers.serve("127.0.0.1"), 1: await holder.tiers.serve("127.0.0.1")}
        owner.tiers.start_generation(0, addresses)
        write_step(owner.tiers.local_dir, 10)
        owner.tiers.saved(10)  # queued; the copy worker has not run yet
        if at_rest:
            corrupted = await asyncio.wait_for(owner.tiers.corrupt_newest_at_rest(), WAIT)
        else:
            corrupted = owner.tiers.corrupt_newest()
        assert corrupted == 10
        await asyncio.wait_for(owner.tiers.drain(), WAIT)
        sources = [{"tier": "local"}, {"tier": "peer", "holder": 1, "address": addresses[1]}]
        staged.append(await owner.tiers.stage(10, sources))
        await owner.tiers.close()
        await holder.tiers.close()

    staged: list[Any] = []
    run(scenario)
    if at_rest:
        assert staged[0] is not None and (staged[0].tier, staged[0].holder) == (Tier.PEER, 1)
    else:
        assert staged == [None]  # neither the local copy nor a replica: the push refused the bytes


@pytest.mark.parametrize("due", [15, None], ids=["waits-for-the-save-due", "no-step-due"])
def test_chaos_corrupt_waits_for_the_save_due_still_being_written(tmp_path, due):
    """Chaos `corrupt` fired at step 18 with saves every 5 steps: step 15 is due, but on a loaded
    machine the workload is still writing it (a whole run of the suite). The fault waits for it and
    corrupts step 15, the step the next restore reads. The negative control, not told what is due
    (as chaos was before), corrupts step 10, which no restore reads."""

    async def scenario() -> int | None:
        owner = Host(tmp_path, 0, CheckpointSpec(), None)
        await owner.tiers.serve("127.0.0.1")
        owner.tiers.start_generation(0, {})
        write_step(owner.tiers.local_dir, 10)
        owner.tiers.saved(10)
        corrupting = asyncio.create_task(owner.tiers.corrupt_newest_at_rest(due))
        await asyncio.sleep(0.3)  # step 15 still being written
        write_step(owner.tiers.local_dir, 15)
        owner.tiers.saved(15)
        corrupted = await asyncio.wait_for(corrupting, WAIT)
        await owner.tiers.close()
        return corrupted

    assert run(scenario) == (15 if due else 10)


def test_chaos_corrupt_strikes_the_save_due_though_a_newer_step_was_saved_meanwhile(tmp_path):
    """Fired at step 18, saves every 5 steps: step 15 is due. A host that does not wait for the others
    has saved step 20 by the time the fault strikes; the restore after a host killed at step 20 reads
    step 15, so step 15 is corrupted. Before: the newest, 20 (a whole run of the suite: the restore
    took step 15 from the local tier, no corruption in sight)."""

    async def scenario() -> int | None:
        owner = Host(tmp_path, 0, CheckpointSpec(), None)
        await owner.tiers.serve("127.0.0.1")
        owner.tiers.start_generation(0, {})
        for step in (10, 15, 20):
            write_step(owner.tiers.local_dir, step)
            owner.tiers.saved(step)
        corrupted = await asyncio.wait_for(owner.tiers.corrupt_newest_at_rest(15), WAIT)
        await owner.tiers.close()
        return corrupted

    assert run(scenario) == 15


def test_staging_with_no_valid_source_left_returns_none_and_commits_nothing(tmp_path):
    async def scenario():
        host = Host(tmp_path, 0, CheckpointSpec(), None)
        await host.tiers.serve("127.0.0.1")
        sources = [{"tier": "peer", "holder": 1, "address": "127.0.0.1:9"}, {"tier": "persistent"}]
        assert await host.tiers.stage(10, sources) is None
        assert shard_folder.committed_steps(host.tiers.local_dir) == []
        assert [r["type"] for r in host.logs] == ["stage_failed", "stage_failed"]
        await host.tiers.close()

    run(scenario)


def test_a_lost_machine_loses_its_local_tier_and_the_replicas_it_held(tmp_path):
    host = Host(tmp_path, 0, CheckpointSpec(), None)
    write_step(host.tiers.local_dir, 10)
    write_step(host.tiers.replicas.folder(1, 10).parent, 10)
    host.tiers.wipe()
    assert not host.tiers.disk.exists()


def test_corrupting_with_no_committed_step_does_nothing(tmp_path):
    host = Host(tmp_path, 0, CheckpointSpec(), None)
    assert host.tiers.corrupt_newest() is None


def pushes_of_three_saves(tmp_path: Path, *, each_waits: bool) -> tuple[list[int], list[int]]:
    """Steps 5, 10 and 15 saved in turn (`each_waits`: each save waits for its copies to be done):
    the steps pushed, and the steps the peer holds."""

    async def scenario():
        owner, holder = Host(tmp_path, 0, spec(tmp_path), None), Host(tmp_path, 1, spec(tmp_path), None)
        addresses = {0: await owner.tiers.serve("127.0.0.1"), 1: await holder.tiers.serve("127.0.0.1")}
        owner.tiers.start_generation(0, addresses)
        for step in (5, 10, 15):
            write_step(owner.tiers.local_dir, step)
            owner.tiers.saved(step)
            if each_waits:
                await asyncio.wait_for(owner.tiers.drain(), WAIT)
        await asyncio.wait_for(owner.tiers.drain(), WAIT)
        pushed = [log["step"] for log in owner.logs if log["type"] == "replicated"]
        await owner.tiers.close()
        await holder.tiers.close()
        return pushed, holder.tiers.replicas.steps(0)

    return asyncio.run(scenario())


def test_saves_faster_than_the_pushes_send_the_peers_the_newest_step_not_every_one(tmp_path):
    """Steps 5, 10 and 15 are saved before the copies get to them: the peer gets 15 alone. Pushing
    every save in turn only falls further behind, and the newest copy is the one every other host
    still holds locally when a host is lost."""
    assert pushes_of_three_saves(tmp_path, each_waits=False) == ([15], [15])


def test_negative_control_saves_that_wait_for_their_push_are_each_pushed(tmp_path):
    assert pushes_of_three_saves(tmp_path, each_waits=True) == ([5, 10, 15], [10, 15])  # 2 kept

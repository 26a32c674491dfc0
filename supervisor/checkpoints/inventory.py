"""What a run's checkpoints are and where their copies lie: `slicekeeper checkpoint list` and `export`.

A step of a job is spread over many shard folders (slicekeeper.shard_folder): each host's in its own
local tier, replicas on peers, and every host's under the persistent tier's URI. This module finds
them all for a source the user names, a run directory (its `plan.json` says where the machines'
disks and the persistent tier are) or a persistent-tier location (`<uri>/<job>/<run id>`), checks
each against its manifest, and says for each step whether its copies hold every part of every leaf.

No framework code: completeness is worked out from the shard names (positions) and the layout in the
manifests, so `list` runs wherever the supervisor does. Persistent copies are checked by downloading
them (verified on the way) into a scratch directory the caller owns.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from slicekeeper.supervisor.checkpoints.peer_tier import ReplicaStore
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError
from slicekeeper.supervisor.plan import JobPlan

from slicekeeper import shard_folder
from slicekeeper.errors import UserError
from slicekeeper.shard_folder import CorruptCheckpoint, Manifest


@dataclass(frozen=True)
class ShardCopy:
    """One shard folder of one step, in one tier."""

    step: int
    tier: str
    """`local`, `peer` or `persistent`."""
    holder: str
    """Who keeps it: a machine (`host-2`, `spare-0`) or the persistent tier's location."""
    owner: int | None
    """The host whose shard it is, where the tier says (a peer's replica, a persistent upload)."""
    folder: Path | None
    """Where it is on this machine (None for a persistent copy not downloaded)."""
    manifest: Manifest | None
    """None when the manifest could not be read."""
    problem: str | None = None
    """Why the copy cannot be used (unreadable, checksum mismatch); None: intact as far as checked."""

    @property
    def bytes(self) -> int:
        return self.manifest.total_bytes if self.manifest else 0

    @property
    def files(self) -> int:
        return len(self.manifest.shards) if self.manifest else 0


@dataclass(frozen=True)
class StepSummary:
    step: int
    copies: tuple[ShardCopy, ...]
    complete: bool
    """The intact copies hold every part of every leaf: the step can be restored or exported."""
    framework: str | None
    missing: str | None = None
    """What keeps an incomplete step from being whole."""


class CheckpointSource:
    """The checkpoints of one run: a run directory, or a persistent-tier location."""

    def __init__(self, source: str, scratch: Path) -> None:
        self.source = source
        self._scratch = scratch
        """Where persistent copies are downloaded to be checked or read."""
        self._disks: list[tuple[str, Path]] = []
        self._persistent: PersistentTier | None = None
        path = Path(source)
        if "://" not in source and (path / "plan.json").is_file():
            plan = JobPlan.read(path / "plan.json")
            self._disks = [(machine, plan.machine_disk(machine)) for machine in plan.machines]
            persistent = plan.training_job.spec.checkpoint.persistent
            if persistent is not None and plan.run_key:
                self._persistent = PersistentTier(persistent.uri, plan.run_key)
        elif "://" in source or path.is_dir():
            base, _, key = source.rstrip("/").rpartition("/")
            if not base or not key:
                raise UserError(
                    f"{source}: expected a run directory or a persistent location <uri>/<job>/<run>"
                )
            self._persistent = PersistentTier(base, key)
        else:
            raise UserError(
                f"{source}: no such run directory (a folder with plan.json) or persistent-tier location"
            )

    def copies(self, verify: bool = True, steps: Iterable[int] | None = None) -> list[ShardCopy]:
        """Every shard folder of the run on this machine's disks and in the persistent tier (only
        `steps` when given); each re-hashed against its manifest when `verify`. Persistent copies are
        downloaded to be checked, or only their manifests read when not `verify`."""
        wanted = None if steps is None else set(steps)
        found = [c for c in self._disk_copies(verify) if wanted is None or c.step in wanted]
        found += list(self._persistent_copies(verify, wanted))
        return sorted(found, key=lambda c: (c.step, c.tier, c.holder, c.owner or 0))

    def _disk_copies(self, verify: bool) -> Iterator[ShardCopy]:
        for machine, disk in self._disks:
            own = int(machine.removeprefix("host-")) if machine.startswith("host-") else None
            for step in shard_folder.committed_steps(disk / "local"):
                yield _checked(
                    step, "local", machine, own, shard_folder.step_dir(disk / "local", step), verify
                )
            replicas = ReplicaStore(disk / "peers", keep=0)  # read only: keep is for its writes
            for owner, steps in replicas.inventory().items():
                for step in steps:
                    yield _checked(step, "peer", machine, owner, replicas.folder(owner, step), verify)

    def _persistent_copies(self, verify: bool, wanted: set[int] | None) -> Iterator[ShardCopy]:
        tier = self._persistent
        if tier is None:
            return
        try:
            owners = tier.committed_owners()
        except PersistentTierError as error:
            if not self._disks:  # the only source the user named
                raise UserError(str(error)) from None
            return
        for step, hosts in owners.items():
            if wanted is not None and step not in wanted:
                continue
            for host in sorted(hosts):
                yield self._persistent_copy(tier, step, host, verify)

    def _persistent_copy(self, tier: PersistentTier, step: int, host: int, verify: bool) -> ShardCopy:
        try:
            if not verify:
                return ShardCopy(step, "persistent", tier.location, host, None, tier.manifest(host, step))
            destination = self._scratch / "persistent" / f"host-{host}"
            tier.download(host, step, destination)  # verified while copied
        except (PersistentTierError, CorruptCheckpoint) as error:
            return ShardCopy(step, "persistent", tier.location, host, None, None, str(error))
        folder = shard_folder.step_dir(destination, step)
        return ShardCopy(step, "persistent", tier.location, host, folder, shard_folder.read_manifest(folder))


def _checked(step: int, tier: str, holder: str, owner: int | None, folder: Path, verify: bool) -> ShardCopy:
    try:
        manifest = shard_folder.verify(folder) if verify else shard_folder.read_manifest(folder)
    except CorruptCheckpoint as error:
        with contextlib.suppress(CorruptCheckpoint):
            return ShardCopy(
                step, tier, holder, owner, folder, shard_folder.read_manifest(folder), str(error)
            )
        return ShardCopy(step, tier, holder, owner, folder, None, str(error))
    return ShardCopy(step, tier, holder, owner, folder, manifest)


def coverage(copies: Iterable[ShardCopy]) -> tuple[str | None, str | None]:
    """(framework, what is missing or None) for the intact copies of one step, from their manifests:
    each leaf's distinct positions must add up to its whole global shape."""
    usable = [c.manifest for c in copies if c.manifest is not None and c.problem is None]
    if not usable:
        return None, "no intact copy"
    layouts = {m.layout for m in usable if m.layout is not None}
    if not layouts:
        return None, "no layout in the manifests: the leaves have no names"
    if len(layouts) > 1:
        return None, "the copies describe different training states"
    layout = layouts.pop()
    positions: dict[str, set[str]] = {leaf.key: set() for leaf in layout.leaves}
    for manifest in usable:
        for shard in manifest.shards:
            key, _, where = shard.name.partition("/")
            positions.setdefault(key, set()).add(where)
    for leaf in layout.leaves:
        held = sum(_volume(where) for where in positions[leaf.key])
        if held != math.prod(leaf.shape):
            return layout.framework, f"{leaf.path}: {held} of {math.prod(leaf.shape)} elements held"
    return layout.framework, None


def _volume(where: str) -> int:
    if where == "scalar":
        return 1
    try:
        return math.prod(
            int(stop) - int(start) for start, stop in (part.split("-") for part in where.split("_"))
        )
    except ValueError:
        return 0


def summarize(copies: Iterable[ShardCopy]) -> list[StepSummary]:
    """The copies grouped by step, oldest first, each step said complete or not."""
    by_step: dict[int, list[ShardCopy]] = {}
    for copy in copies:
        by_step.setdefault(copy.step, []).append(copy)
    summaries = []
    for step, held in sorted(by_step.items()):
        framework, missing = coverage(held)
        summaries.append(StepSummary(step, tuple(held), missing is None, framework, missing))
    return summaries

"""`slicekeeper checkpoint list` and `export`: a run's checkpoints, and taking one to the user's tools.

`list` shows what a run directory or a persistent-tier location holds: each step, the tiers and
machines that keep a copy, its size, whether every copy matches its checksums, and whether the intact
copies make a whole state. `export` puts one whole step (default: the newest) back together from the
hosts' shard folders and writes it in the framework's standard format: an orbax checkpoint for a JAX
job, a torch.distributed.checkpoint directory for a PyTorch one (docs/checkpointing.md).

The glue between the supervisor's inventory (where copies are, no framework) and the workload's
formats (numpy, orbax, torch): imported only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from slicekeeper.supervisor.checkpoints.inventory import CheckpointSource, ShardCopy, StepSummary, summarize

from slicekeeper.errors import UserError

if TYPE_CHECKING:
    from slicekeeper.workload.global_arrays import GlobalCheckpoint

FORMATS = {"jax": "orbax", "torch": "torch.distributed.checkpoint"}


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000  # type: ignore[assignment]
    raise AssertionError


def _state_bytes(copies: tuple[ShardCopy, ...]) -> int:
    """The size of one whole state: every distinct shard counted once, however many copies."""
    sizes: dict[str, int] = {}
    for copy in copies:
        if copy.manifest is not None and copy.problem is None:
            for shard in copy.manifest.shards:
                sizes.setdefault(shard.name, shard.size)
    return sum(sizes.values())


def _where(copies: tuple[ShardCopy, ...], tier: str) -> str:
    held = [c for c in copies if c.tier == tier]
    if not held:
        return "-"
    if tier == "persistent":
        owners = sorted(c.owner for c in held if c.owner is not None)
        return f"hosts {','.join(map(str, owners))}"
    return ", ".join(c.holder if c.tier == "local" else f"{c.holder}(host-{c.owner})" for c in held)


def _copy_name(copy: ShardCopy) -> str:
    """`the peer copy of host-0 on host-1`, `the persistent copy of host-1`, `the local copy on host-2`."""
    whose = f" of host-{copy.owner}" if copy.owner is not None and copy.tier != "local" else ""
    where = f" on {copy.holder}" if copy.tier != "persistent" else ""
    return f"the {copy.tier} copy{whose}{where}"


def list_command(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="slicekeeper-list-") as scratch:
        source = CheckpointSource(args.source, Path(scratch))
        steps = summarize(source.copies(verify=not args.no_verify))
    console = Console(width=max(Console().width, 120))
    if not steps:
        console.print(f"{args.source}: no committed checkpoint")
        return 1
    table = Table(title=f"Checkpoints of {args.source}", title_justify="left")
    for column in ("step", "whole", "framework", "size", "local", "peer", "persistent", "integrity"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for summary in steps:
        bad = [c for c in summary.copies if c.problem is not None]
        checked = "names and sizes only" if args.no_verify else "checksums match"
        table.add_row(
            str(summary.step),
            "yes" if summary.complete else f"no: {summary.missing}",
            summary.framework or "?",
            _size(_state_bytes(summary.copies)),
            _where(summary.copies, "local"),
            _where(summary.copies, "peer"),
            _where(summary.copies, "persistent"),
            f"{len(bad)} of {len(summary.copies)} copies bad"
            if bad
            else f"{len(summary.copies)} copies, {checked}",
        )
    console.print(table)
    for summary in steps:
        for copy in summary.copies:
            if copy.problem is not None:
                console.print(f"step {copy.step}, {_copy_name(copy)}: {copy.problem}", markup=False)
    return 0


def _chosen(source: CheckpointSource, wanted: int | None, where: str) -> StepSummary:
    """The step to export, its copies verified: `wanted`, or the newest whose intact copies make a
    whole state. Steps are picked from their manifests first, and only the candidate's copies are
    re-hashed (and downloaded), newest first, so an export does not check every step it skips."""
    listed = summarize(source.copies(verify=False))
    if wanted is not None and wanted not in [s.step for s in listed]:
        whole = [s.step for s in listed if s.complete]
        raise UserError(f"--step {wanted}: not in {where} (steps held whole: {whole or 'none'})")
    candidates = [s.step for s in reversed(listed) if s.complete and wanted in (None, s.step)]
    tried = []
    for step in candidates:
        [summary] = summarize(source.copies(verify=True, steps=[step]))
        if summary.complete:
            return summary
        tried.append(f"{step} ({summary.missing})")
    if wanted is not None:
        missing = tried[0] if tried else next(f"{s.step} ({s.missing})" for s in listed if s.step == wanted)
        raise UserError(f"--step {wanted}: not whole in {where}: {missing}")
    held = ", ".join(tried + [f"{s.step} ({s.missing})" for s in listed if not s.complete]) or "none"
    raise UserError(f"{where}: no whole checkpoint to export (steps held: {held})")


def export_command(args: argparse.Namespace) -> int:
    destination: Path = args.destination
    if destination.exists():
        raise UserError(f"{destination}: already exists; export writes a new directory")
    if not destination.parent.is_dir():
        raise UserError(f"{destination.parent}: no such directory")
    started = time.monotonic()
    say = Console(stderr=True, highlight=False).print
    with tempfile.TemporaryDirectory(prefix="slicekeeper-export-") as scratch:
        source = CheckpointSource(args.source, Path(scratch))
        say(f"reading {args.source} (the chosen step's copies checked against their checksums)")
        summary = _chosen(source, args.step, args.source)
        for copy in summary.copies:
            if copy.problem is not None:
                say(f"  skipping {_copy_name(copy)}: {copy.problem}", markup=False)
        folders = [c.folder for c in summary.copies if c.problem is None and c.folder is not None]
        framework = summary.framework or "?"
        if framework not in FORMATS:
            raise UserError(
                f"{args.source}: step {summary.step} was written by {framework!r}, which has no export"
            )
        say(f"step {summary.step} ({framework}): putting {len(folders)} shard folders together")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # an export must never take a TPU from training
        try:
            from slicekeeper.workload.global_arrays import assemble
        except ImportError as error:  # numpy comes with either framework's extra
            raise UserError(
                f"exporting needs the framework's extra: pip install 'slicekeeper[{framework}]' ({error})"
            ) from None
        checkpoint = assemble(folders, verified=True)  # every copy was just checked
        partial = destination.with_name(f"{destination.name}.partial-{os.getpid()}")
        say(f"writing {FORMATS[framework]} to {destination}")
        try:
            _write(framework, checkpoint, partial)
            os.rename(partial, destination)
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # a failed write leaves nothing taken as valid
    total = sum(array.nbytes for array in checkpoint.arrays.values())
    seconds = time.monotonic() - started
    print(
        f"exported step {checkpoint.step} of {args.source} to {destination}: "
        f"{len(checkpoint.arrays)} arrays, {_size(total)}, {FORMATS[framework]}, in {seconds:.1f} s"
    )
    return 0


def _write(framework: str, checkpoint: GlobalCheckpoint, destination: Path) -> None:
    try:
        if framework == "jax":
            from slicekeeper.workload import orbax_format

            orbax_format.write(checkpoint, destination)
        else:
            from slicekeeper.workload import dcp_format

            dcp_format.write(checkpoint, destination)
    except ImportError as error:
        raise UserError(
            f"exporting a {framework} checkpoint needs its extra: "
            f"pip install 'slicekeeper[{framework}]' ({error})"
        ) from None

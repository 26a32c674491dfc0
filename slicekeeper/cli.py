"""The `slicekeeper` command line: `run` a job locally, `crd` to print the generated CRD.

User errors (a bad file, a bad field, a bad flag) print one clear message and exit 2; a job that
fails exits 1; success exits 0. The CLI is the one core module that dispatches to the runtimes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from slicekeeper.api import load_training_job
from slicekeeper.errors import JobFailed, UserError


def _run(args: argparse.Namespace) -> int:
    from slicekeeper.supervisor.local_runtime import LocalRuntime

    from slicekeeper.topology import local_layout

    job = load_training_job(args.file)
    overrides = {
        k: v
        for k, v in (
            ("hosts", args.hosts),
            ("devices_per_host", args.devices_per_host),
            ("spares", args.spares),
        )
        if v is not None
    }
    if overrides:
        local = job.spec.local.model_copy(update=overrides)
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"local": local})})
    layout = local_layout(job)
    runtime = LocalRuntime(
        job,
        layout.hosts,
        layout.slices,
        layout.devices_per_host,
        steps=args.steps,
        chaos=args.chaos,
        report_path=args.report,
    )
    report = asyncio.run(runtime.run())
    if report["state"] != "succeeded":
        raise JobFailed(report.get("failure_reason") or report["state"])
    return 0


def _crd(args: argparse.Namespace) -> int:
    from slicekeeper.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml())
    return 0


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type for a whole number of at least `minimum`."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return convert


_positive, _whole = _at_least(1), _at_least(0)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="slicekeeper", description="Keep sharded TPU training jobs productive."
    )
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a TrainingJob on this machine, hosts as processes")
    run.add_argument("file", type=Path, help="TrainingJob YAML")
    run.add_argument("--steps", type=_positive, help="training steps (overrides spec.workload.steps)")
    run.add_argument(
        "--chaos",
        help="faults to inject, e.g. 'kill:host=1@step=30,lose:host=2@step=60' "
        "(kinds: kill, hang, lose, corrupt)",
    )
    run.add_argument("--report", type=Path, help="report JSON path (default: <run dir>/report.json)")
    run.add_argument("--hosts", type=_positive, help="local host processes (overrides spec.local.hosts)")
    run.add_argument(
        "--devices-per-host", type=_positive, help="CPU devices per host (spec.local.devicesPerHost)"
    )
    run.add_argument(
        "--spares", type=_whole, help="spare host processes for hot-swaps (overrides spec.local.spares)"
    )
    run.set_defaults(handler=_run)
    crd = commands.add_parser("crd", help="print the TrainingJob CustomResourceDefinition")
    crd.set_defaults(handler=_crd)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (UserError, JobFailed) as error:
        print(f"slicekeeper: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

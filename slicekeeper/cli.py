"""The `slicekeeper` command line: `run` a job locally, `render` its cluster manifests, `operator` to
run the Kubernetes operator, `policy replay` a policy on an event log, `checkpoint list` and
`checkpoint export` a run's checkpoints, `crd` to print the CRD.

User errors (a bad file, a bad field, a bad flag) print one clear message and exit 2; a job that
fails exits 1; success exits 0. The CLI is the one core module that dispatches to the runtimes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from slicekeeper.api import TrainingJob, load_training_job
from slicekeeper.chaos import ChaosKind
from slicekeeper.errors import JobFailed, UserError


def _run(args: argparse.Namespace) -> int:
    from slicekeeper.supervisor.local.local_runtime import LocalRuntime

    from slicekeeper.api import local_layout

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
    job = _with_checked_policy(job, job_file=args.file, policy=args.policy)
    job = _with_checked_init_from(job, job_file=args.file, init_from=args.init_from)
    runtime = LocalRuntime(
        job,
        local_layout(job),
        steps=args.steps,
        chaos=args.chaos,
        report_path=args.report,
        progress=args.progress,
    )
    report = asyncio.run(runtime.run())
    if report["state"] != "succeeded":
        raise JobFailed(report.get("failure_reason") or report["state"])
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from slicekeeper.supervisor.fleet.costs import CostModel, with_settings
    from slicekeeper.supervisor.fleet.failures import failure_model
    from slicekeeper.supervisor.fleet.projection import project, scenario, table
    from slicekeeper.supervisor.fleet.sweep import parse, sweep, sweep_table

    job = _with_checked_policy(load_training_job(args.file), job_file=args.file, policy=args.policy)
    if args.replay is not None:
        return _simulate_replay(args, job)
    if args.costs_from is not None:
        raise UserError("--costs-from goes with --replay")
    if args.sweep and args.report is not None:
        raise UserError("--report goes with a single simulation, not --sweep")
    if args.report is not None and not args.report.parent.is_dir():
        raise UserError(f"--report {args.report}: {args.report.parent} is not a directory")
    swept = parse(args.sweep)
    chosen = scenario(
        job,
        chips=args.chips,
        slices=args.slices,
        days=args.days,
        failures=failure_model(args.failures),
        costs=with_settings(CostModel(step_seconds=args.step_seconds), args.cost),
        spares=args.spares,
        seed=args.seed,
        max_restarts=args.max_restarts,
    )
    if swept:
        figures = sweep(chosen, swept, progress=not args.json)
        print(json.dumps(figures) if args.json else sweep_table(figures))
    else:
        figures = project(chosen, report=args.report)
        print(json.dumps(figures) if args.json else table(figures))
    return 0


def _simulate_replay(args: argparse.Namespace, job: TrainingJob) -> int:
    from slicekeeper.supervisor.fleet.replay import comparison, replay

    if args.sweep or args.report is not None:
        raise UserError("--replay predicts one recorded run: no --sweep or --report with it")
    figures = replay(job, args.replay, costs_from=args.costs_from, spares=args.spares)
    print(json.dumps(figures) if args.json else comparison(figures))
    return 0


def _with_checked_policy(job: TrainingJob, *, job_file: Path, policy: Path | None) -> TrainingJob:
    """The job with its policy file (`--policy`, relative to the current directory, else
    `spec.policy.file`, relative to the TrainingJob file) loaded, checked and made absolute, so that
    every supervisor reads the same file; a policy that cannot work stops the run before it starts."""
    from slicekeeper.policy.engine import PolicyEngine

    if policy is not None:
        path: Path | None = policy.resolve()
    elif job.spec.policy.file is not None:
        path = (job_file.parent / job.spec.policy.file).resolve()
    elif job.spec.policy.source is not None:  # inline: a file of its own, for the supervisors to read
        path = Path(tempfile.mkdtemp(prefix="slicekeeper-policy-")) / "policy.py"
        path.write_text(job.spec.policy.source, encoding="utf-8")
    else:
        path = None
    ref = job.spec.policy.model_copy(update={"file": str(path) if path else None, "source": None})
    PolicyEngine.from_spec(ref)  # raises UserError for a file that cannot work
    return job.model_copy(update={"spec": job.spec.model_copy(update={"policy": ref})})


def _with_checked_init_from(job: TrainingJob, *, job_file: Path, init_from: str | None) -> TrainingJob:
    """The job with the checkpoint it starts from (`--init-from`, relative to the current directory,
    else `spec.workload.initFrom`, relative to the TrainingJob file) made absolute, so that every host
    reads the same one; a local checkpoint that is not there stops the run before it starts."""
    field = "--init-from" if init_from is not None else "spec.workload.initFrom"
    location = init_from if init_from is not None else job.spec.workload.init_from
    if location is None:
        return job
    if "://" not in location:
        base = Path.cwd() if init_from is not None else job_file.parent
        path = (base / location).resolve()
        if not path.is_dir():
            raise UserError(
                f"{field}: {path} is not a checkpoint directory "
                "(make one with `slicekeeper checkpoint export`)"
            )
        location = str(path)
    workload = job.spec.workload.model_copy(update={"init_from": location})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"workload": workload})})


def _render(args: argparse.Namespace) -> int:
    from slicekeeper.operator.render import manifests, render, yaml_documents

    job = load_training_job(args.file)
    checked = _with_checked_policy(job, job_file=args.file, policy=args.policy)
    file = checked.spec.policy.file
    source = Path(file).read_text(encoding="utf-8") if file is not None else None
    if source is not None:  # the pods read the policy from the job's ConfigMap
        policy = job.spec.policy.model_copy(update={"file": None, "source": None})
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"policy": policy})})
    rendered = render(job, source)
    if args.slices is not None and not set(args.slices) <= set(range(rendered.layout.shape.slices)):
        slices = rendered.layout.shape.slices
        raise UserError(f"--slices: the job has slices 0..{slices - 1}, not {args.slices}")
    sys.stdout.write(yaml_documents(manifests(rendered, args.slices)))
    return 0


def _policy_replay(args: argparse.Namespace) -> int:
    from slicekeeper.policy.engine import PolicyEngine, load_policy
    from slicekeeper.policy.replay import format_replay, read_log, replay

    engine = PolicyEngine(load_policy(args.policy) if args.policy else None)
    records = read_log(args.events)
    name = args.policy.name if args.policy else "default policy"
    sys.stdout.write(format_replay(replay(records, engine), policy=name))
    return 0


def _operator(args: argparse.Namespace) -> int:
    try:
        from slicekeeper.operator.main import run
    except ImportError as error:
        raise UserError(
            f"the operator needs its extra: pip install 'slicekeeper[operator]' ({error})"
        ) from None
    return run(
        args.namespace,
        args.server,
        args.liveness,
        args.metrics_port,
        log_level=args.log_level,
        api_qps=args.api_qps,
        api_burst=args.api_burst,
        create_concurrency=args.create_concurrency,
        leader_election=args.leader_election,
        lease_namespace=args.leader_election_namespace,
        lease_seconds=args.leader_election_lease_seconds,
        status_interval=args.status_interval,
    )


def _checkpoint_list(args: argparse.Namespace) -> int:
    from slicekeeper.checkpoint_cli import list_command

    return list_command(args)


def _checkpoint_export(args: argparse.Namespace) -> int:
    from slicekeeper.checkpoint_cli import export_command

    return export_command(args)


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


def _slice_list(text: str) -> list[int]:
    try:
        slices = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected slice numbers like 0,2, not {text!r}") from None
    if not slices or slices[0] < 0:
        raise argparse.ArgumentTypeError(f"expected slice numbers like 0,2, not {text!r}")
    return slices


def _checkpoint_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoint = commands.add_parser(
        "checkpoint", help="list a run's checkpoints, export one to orbax or DCP (docs/checkpointing.md)"
    )
    verbs = checkpoint.add_subparsers(dest="checkpoint_command", required=True)
    where = "a run directory (with plan.json) or a persistent-tier location <uri>/<job>/<run>"
    listing = verbs.add_parser("list", help="steps, tiers, hosts, sizes and integrity of a run's checkpoints")
    listing.add_argument("source", help=where)
    listing.add_argument(
        "--no-verify", action="store_true", help="read the manifests only, do not re-hash every file"
    )
    listing.set_defaults(handler=_checkpoint_list)
    export = verbs.add_parser(
        "export", help="write one whole step as an orbax checkpoint (JAX) or a torch.distributed.checkpoint"
    )
    export.add_argument("source", help=where)
    export.add_argument("destination", type=Path, help="the new checkpoint directory (must not exist)")
    export.add_argument("--step", type=_whole, help="the step to export (default: the newest whole one)")
    export.set_defaults(handler=_checkpoint_export)


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
        f"(kinds: {', '.join(k.value for k in ChaosKind)}; docs/local-mode.md)",
    )
    run.add_argument("--report", type=Path, help="report JSON path (default: <run dir>/report.json)")
    run.add_argument("--hosts", type=_positive, help="local host processes (overrides spec.local.hosts)")
    run.add_argument(
        "--devices-per-host", type=_positive, help="CPU devices per host (spec.local.devicesPerHost)"
    )
    run.add_argument(
        "--spares", type=_whole, help="spare host processes for hot-swaps (overrides spec.local.spares)"
    )
    run.add_argument(
        "--policy",
        type=Path,
        help="remediation policy file (overrides spec.policy.file; docs/policy.md)",
    )
    run.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start from this orbax (JAX) or torch.distributed.checkpoint (PyTorch) checkpoint, at the "
        "step it holds (overrides spec.workload.initFrom; docs/checkpointing.md)",
    )
    run.add_argument(
        "--progress",
        choices=["auto", "live", "plain"],
        default="auto",
        help="live: a view redrawn in place; plain: a status line every few seconds and every event; "
        "auto (default): live on a terminal, plain otherwise",
    )
    run.set_defaults(handler=_run)
    simulate = commands.add_parser(
        "simulate",
        help="project a TrainingJob's goodput at its real size over days, failures at published rates "
        "(docs/simulator.md)",
    )
    simulate.add_argument("file", type=Path, help="TrainingJob YAML")
    size = simulate.add_mutually_exclusive_group()
    size.add_argument("--chips", type=_whole, help="scale the job to this many chips (whole slices)")
    size.add_argument("--slices", type=_whole, help="scale the job to this many slices")
    simulate.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    simulate.add_argument(
        "--failures", default="llama3", help="failure model: llama3, kokolis or a YAML file (default llama3)"
    )
    simulate.add_argument("--step-seconds", type=float, default=10.0, help="the job's step time (default 10)")
    simulate.add_argument("--spares", type=_whole, help="spare machines (default: one per 64 hosts)")
    simulate.add_argument("--policy", type=Path, help="remediation policy file (overrides spec.policy.file)")
    simulate.add_argument(
        "--cost", action="append", default=[], help="a cost model setting, NAME=VALUE (repeatable)"
    )
    simulate.add_argument("--max-restarts", type=_whole, help="a job-wide restart cap (default: none)")
    simulate.add_argument("--seed", type=int, default=0, help="the failure schedule's seed (default 0)")
    simulate.add_argument(
        "--replay",
        type=Path,
        metavar="REPORT.json",
        help="predict a recorded `slicekeeper run` (its faults, step time and measured costs) and print "
        "the predicted goodput beside the measured one",
    )
    simulate.add_argument(
        "--costs-from",
        type=Path,
        metavar="REPORT.json",
        help="with --replay: take every recovery cost from this other run instead",
    )
    simulate.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V,V,...",
        help="run every combination of these settings on the same failures and print each goodput and "
        "the best (checkpoint.interval, spares, cost.NAME; e.g. checkpoint.interval=5,10,20,spares=0,64)",
    )
    simulate.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help="also write slicekeeper's simulated run as a run's report (its page and policy event log "
        "beside it)",
    )
    simulate.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    simulate.set_defaults(handler=_simulate)
    policy = commands.add_parser("policy", help="work with remediation policies")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    replay = policy_commands.add_parser(
        "replay",
        help="print the decisions a policy would take on a recorded event log (runs nothing)",
    )
    replay.add_argument("events", type=Path, help="event log (policy-events.jsonl, next to the report)")
    replay.add_argument("--policy", type=Path, help="policy file (default: the default policy)")
    replay.set_defaults(handler=_policy_replay)
    render = commands.add_parser(
        "render", help="print every manifest the operator would create for a TrainingJob (no cluster)"
    )
    render.add_argument("file", type=Path, help="TrainingJob YAML")
    render.add_argument(
        "--slices",
        type=_slice_list,
        help="only these slices' pods, e.g. 0,2 (default: every slice; as after a scale-down)",
    )
    render.add_argument(
        "--policy", type=Path, help="policy file to store in the ConfigMap (overrides spec.policy)"
    )
    render.set_defaults(handler=_render)
    operator = commands.add_parser(
        "operator", help="run the Kubernetes operator (TrainingJobs to TPU slice pods; docs/operator.md)"
    )
    operator.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="serve only this namespace (repeatable; default: all)",
    )
    operator.add_argument(
        "--server", help="API server URL (default: the service account, else the kubeconfig)"
    )
    operator.add_argument(
        "--liveness", default="http://0.0.0.0:8080/healthz", help="kopf's liveness endpoint for the probe"
    )
    operator.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="the operator's log level (default info; debug includes kopf's own)",
    )
    operator.add_argument(
        "--metrics-port",
        type=_whole,
        default=9464,
        help="port of the operator's Prometheus metrics, /metrics on every address (default: 9464; "
        "0: a free port, logged)",
    )
    operator.add_argument(
        "--api-qps",
        type=float,
        help="client-side limit on the operator's API requests a second (default 1000; 0: none)",
    )
    operator.add_argument(
        "--api-burst", type=_whole, help="requests the limit lets through at once (default 400)"
    )
    operator.add_argument(
        "--create-concurrency",
        type=_whole,
        help="creates in flight at once, in slow-start batches of 1, 2, 4, ... (default 64)",
    )
    operator.add_argument(
        "--leader-election",
        action="store_true",
        help="act only while holding the Lease slicekeeper-operator (for several replicas)",
    )
    operator.add_argument(
        "--leader-election-namespace",
        help="the Lease's namespace (default: the operator's own, else default)",
    )
    operator.add_argument(
        "--leader-election-lease-seconds",
        type=_whole,
        default=15,
        help="how long a replica waits for an unrenewed Lease before it takes over (default 15)",
    )
    operator.add_argument(
        "--status-interval",
        type=float,
        default=5.0,
        help="seconds between runs of each job's timer (its status, missing pods; default 5)",
    )
    operator.set_defaults(handler=_operator)
    _checkpoint_commands(commands)
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

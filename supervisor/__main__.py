"""One machine's supervisor.

- `python -m slicekeeper.supervisor --plan plan.json --host N | --spare N`: local mode (the local
  runtime writes the plan and starts one per host process);
- `python -m slicekeeper.supervisor --in-pod -- COMMAND...`: a TPU pod's entrypoint; its plan comes from
  the pod's environment and the job's ConfigMap (supervisor/pod/pod_plan.py), COMMAND is the workload.
"""

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from slicekeeper.supervisor.host import HostSupervisor
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.pod.pod_plan import pod_plan

from slicekeeper import protocol
from slicekeeper.credentials import CredentialsError
from slicekeeper.errors import UserError


def in_pod(command: list[str]) -> int:
    try:
        plan, host = pod_plan(os.environ, command)
    except UserError as error:
        print(f"slicekeeper supervisor: {error}", file=sys.stderr)
        return error.exit_code
    machine = os.environ.get(protocol.ENV_NODE_NAME) or f"host-{host.index}"  # the node, in reports
    return _supervise(lambda: HostSupervisor(plan, machine, host))


def _supervise(supervisor: Callable[[], HostSupervisor]) -> int:
    """Build the supervisor and run it; credentials missing or unusable, or a place for its socket
    it may not use, end it at once, saying why."""
    try:
        built = supervisor()
    except (CredentialsError, UserError) as error:
        print(f"slicekeeper supervisor: {error}", file=sys.stderr)
        return protocol.EXIT_JOB_FAILED
    return asyncio.run(built.run())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-pod"]:
        rest = argv[1:]
        return in_pod(rest[1:] if rest[:1] == ["--"] else rest)
    parser = argparse.ArgumentParser(prog="python -m slicekeeper.supervisor")
    parser.add_argument("--plan", required=True, type=Path, help="the job plan (plan.json)")
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--host", type=int, help="this host's index (JAX process id)")
    role.add_argument("--spare", type=int, help="this spare's index: it waits to take over a lost host")
    parser.add_argument("--joined-by", help="the chaos fault that brought this spare in (spare:+N@step=S)")
    parser.add_argument(
        "--restart",
        type=int,
        default=0,
        help="how many supervisors ran on this machine before this one (0: its first start)",
    )
    args = parser.parse_args(argv)
    plan = JobPlan.read(args.plan)
    if args.host is not None:
        machine, host = f"host-{args.host}", plan.layout.host(args.host)
    else:
        machine, host = f"spare-{args.spare}", None
    return _supervise(
        lambda: HostSupervisor(plan, machine, host, joined_by=args.joined_by, restart=args.restart)
    )


def leave(code: int) -> NoReturn:
    """End the process with `code` once what it printed and logged is out, without finalizing the
    interpreter: in a pod, daemon threads the supervisor cannot interrupt (its pod's watch, blocked in
    a read of the API server's stream; the kubernetes client's pool) are still alive, and one woken
    at finalization can abort the process (a member that found no leader ended by SIGABRT, not with
    its exit code 4, on a fresh clone of 7009db8), which the operator would read as a crash."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())

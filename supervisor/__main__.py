"""`python -m slicekeeper.supervisor --plan plan.json --host N | --spare N`: one machine's supervisor."""

import argparse
import asyncio
import sys
from pathlib import Path

from slicekeeper.supervisor.host import HostSupervisor
from slicekeeper.supervisor.plan import JobPlan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slicekeeper.supervisor")
    parser.add_argument("--plan", required=True, type=Path, help="the job plan (plan.json)")
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--host", type=int, help="this host's index (JAX process id)")
    role.add_argument("--spare", type=int, help="this spare's index: it waits to take over a lost host")
    parser.add_argument("--joined-by", help="the chaos fault that brought this spare in (spare:+N@step=S)")
    args = parser.parse_args(argv)
    plan = JobPlan.read(args.plan)
    if args.host is not None:
        return asyncio.run(HostSupervisor(plan, f"host-{args.host}", args.host).run())
    return asyncio.run(HostSupervisor(plan, f"spare-{args.spare}", None, joined_by=args.joined_by).run())


sys.exit(main())

"""`python -m slicekeeper.supervisor --plan plan.json --host N`: one host's supervisor."""

import argparse
import asyncio
import sys
from pathlib import Path

from slicekeeper.supervisor.host import HostSupervisor
from slicekeeper.supervisor.plan import JobPlan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slicekeeper.supervisor")
    parser.add_argument("--plan", required=True, type=Path, help="the job plan (plan.json)")
    parser.add_argument("--host", required=True, type=int, help="this host's index (JAX process id)")
    args = parser.parse_args(argv)
    plan = JobPlan.read(args.plan)
    return asyncio.run(HostSupervisor(plan, args.host).run())


sys.exit(main())

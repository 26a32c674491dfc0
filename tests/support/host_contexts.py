"""A host's context (supervisor.host.context) for tests of one part serving a host: the example job's
plan (or the test's), its site, host 0 (or the test's), and what the test gives to watch (its account,
its metrics, its reports, its log and lines; nothing watched where it gives none)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.site import site_of
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.plan import JobPlan
from slicekeeper.supervisor.reporting import Log, Report

from slicekeeper.goodput import GoodputAccountant
from tests.support.plans import example_plan


async def _unheard(message: messages.MemberReport) -> None:
    pass


def host_context(
    *,
    accountant: GoodputAccountant | None = None,
    metrics: SupervisorMetrics | None = None,
    report: Report = _unheard,
    log: Log = lambda record: None,
    say: Callable[[str], None] = lambda line: None,
    folder: Path | None = None,
    plan: JobPlan | None = None,
    host: int = 0,
) -> HostContext:
    folder = folder or Path(tempfile.gettempdir())
    plan = plan or example_plan(folder, local=True)
    account = accountant or GoodputAccountant(time.time())

    def spawn(coroutine: Any) -> asyncio.Task[None]:
        return asyncio.ensure_future(coroutine)

    return HostContext(
        plan=plan,
        site=site_of(plan),
        identity=plan.layout.host(host),
        machine=f"host-{host}",
        folder=folder,
        accountant=account,
        metrics=metrics or SupervisorMetrics(lambda: account),
        log=log,
        report=report,
        say=say,
        spawn=spawn,
        finished=asyncio.Event(),
    )

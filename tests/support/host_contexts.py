"""A host's context (supervisor.host.context) for tests of one part serving a host: the example job's
plan, the local site, host 0, and what the test gives to watch (its account, its metrics, its
reports, its log and lines)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.site import site_of
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.reporting import Log, Report

from slicekeeper.goodput import GoodputAccountant
from tests.support.plans import example_plan


def host_context(
    *,
    accountant: GoodputAccountant,
    metrics: SupervisorMetrics,
    report: Report,
    log: Log,
    say: Callable[[str], None],
    folder: Path | None = None,
) -> HostContext:
    folder = folder or Path(tempfile.gettempdir())
    plan = example_plan(folder, local=True)

    def spawn(coroutine: Any) -> asyncio.Task[None]:
        return asyncio.ensure_future(coroutine)

    return HostContext(
        plan=plan,
        site=site_of(plan),
        identity=plan.layout.host(0),
        machine="host-0",
        folder=folder,
        accountant=accountant,
        metrics=metrics,
        log=log,
        report=report,
        say=say,
        spawn=spawn,
        finished=asyncio.Event(),
    )

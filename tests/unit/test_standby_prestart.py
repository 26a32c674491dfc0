"""The next standby is pre-started once a generation makes new progress, not during its recovery.

A standby's imports take seconds of CPU. Started at a restarted generation's first step, on the
2-core machine they made the first step and the steps executed again 2-5 times slower, which is the
recovery itself. The supervisor's SDK events (supervisor/host/sdk_events.py) now call for the standby
at the end of the first step beyond what the host had done before the generation began.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.host.sdk_events import SdkEvents
from slicekeeper.supervisor.metrics import SupervisorMetrics
from slicekeeper.supervisor.signals.culprit import ActivityTracker
from slicekeeper.supervisor.signals.hang import HangDetector

from slicekeeper import protocol
from slicekeeper.api_spec import HealthSpec
from slicekeeper.goodput import GoodputAccountant
from tests.support.host_contexts import host_context


class Host:
    """A host supervisor's SDK events, counting when it asks for a standby."""

    def __init__(self) -> None:
        self.accountant = GoodputAccountant(time.time())
        self.generation = 0
        self.standby_asked_after: list[int] = []
        self.last_step = 0
        self.step = 0
        """The step in progress (begun, its end being handled)."""
        context = host_context(
            accountant=self.accountant,
            metrics=SupervisorMetrics(lambda: self.accountant),
            report=self.reported,
            log=lambda record: json.dumps(record),
            say=lambda line: None,
        )
        self.sdk = SdkEvents(
            context,
            detector=HangDetector(HealthSpec()),
            activity=ActivityTracker(),
            checkpoint_saved=lambda step: None,
            standby=lambda: None,
            step_begun=self.begun,
            productive_again=lambda: self.standby_asked_after.append(self.step),
        )

    def begun(self, step: int) -> None:
        self.step = step

    async def reported(self, message: messages.MemberReport) -> None:
        if isinstance(message, messages.Progress):
            self.last_step = message.step

    async def generation_runs(self, socket: Path, generation: int, restore: int, steps: range) -> None:
        self.generation = generation
        self.sdk.begin(generation, restore, time.time(), host_count=1)
        _, writer = await asyncio.open_unix_connection(str(socket))
        for step in steps:
            for event in (
                {"type": "step_begin", "step": step},
                {"type": "step_end", "step": step, "loss": 1.0},
            ):
                writer.write(protocol.encode(event))
        await writer.drain()
        async with asyncio.timeout(10):
            while self.last_step != steps[-1]:
                await asyncio.sleep(0.005)
        writer.close()
        await self.sdk.eof(generation).wait()


def test_the_standby_is_asked_for_after_the_first_step_beyond_the_pre_restart_progress(tmp_path):
    async def scenario() -> list[int]:
        host = Host()
        server = await host.sdk.serve(tmp_path / "sdk.sock")
        await host.generation_runs(tmp_path / "sdk.sock", 0, 0, range(1, 40))  # then a fault at step 40
        await host.generation_runs(tmp_path / "sdk.sock", 1, 35, range(36, 45))  # 36-39 again
        server.close()
        return host.standby_asked_after

    # generation 0: after its first step; generation 1: after step 40, not after 36 (its first)
    assert asyncio.run(scenario()) == [1, 40]

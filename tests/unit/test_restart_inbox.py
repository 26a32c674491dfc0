"""The restart machine's inbox (supervisor.leader.restart_inbox): the parts built before the driver
reach it, and the remediation, only once both are attached."""

from __future__ import annotations

import asyncio

import pytest
from slicekeeper.supervisor.leader import restart_events as ev
from slicekeeper.supervisor.leader.restart_inbox import RestartInbox
from slicekeeper.supervisor.leader.restart_state import JobState, RestartState


class Driver:
    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    async def send(self, event: object) -> RestartState:
        assert not callable(event)
        self.events.append(event)  # type: ignore[arg-type]
        return RestartState(phase=JobState.FAILED)


class Remedies:
    def __init__(self) -> None:
        self.decided: list[int] = []

    async def no_replacement(self, host: int) -> None:
        self.decided.append(host)


def test_an_inbox_with_nothing_attached_refuses_instead_of_dropping_the_event():
    inbox = RestartInbox()
    with pytest.raises(RuntimeError, match="not attached"):
        asyncio.run(inbox.fail("no spare"))
    with pytest.raises(RuntimeError, match="not attached"):
        asyncio.run(inbox.no_replacement(2))


def test_events_reach_the_driver_and_an_overdue_replacement_the_remediation():
    inbox, driver, remedies = RestartInbox(), Driver(), Remedies()
    inbox.attach(driver, remedies)

    async def tell() -> RestartState:
        await inbox.fail("no spare")
        await inbox.no_replacement(2)
        return await inbox.send(ev.NoWorkload(3))

    assert asyncio.run(tell()).phase is JobState.FAILED
    assert driver.events == [ev.JobFails("no spare"), ev.NoWorkload(3)]
    assert remedies.decided == [2]

"""The restart machine's address for the leader's parts built before its driver.

The capacity (a new machine serving a host, a host lost before the start with no spare, a
replacement pod that never came) and the background work (a task that failed) tell the restart
machine and the remediation what happened; but the driver (leader.generations) reads the capacity
(replacements on their way hold a start) and runs its timers through the background work, and the
remediation is built on the driver. So the inbox is made first, handed to those parts, and the
driver and the remediation attach to it once built (`attach`), before the leader serves anyone: an
event sent to an inbox with nothing attached is a bug of the leader's assembly, and raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from slicekeeper.supervisor.leader import restart_events
from slicekeeper.supervisor.leader.restart_state import RestartState


class Driver(Protocol):
    async def send(
        self, event: restart_events.Event | Callable[[], restart_events.Event]
    ) -> RestartState: ...


class Remedies(Protocol):
    async def no_replacement(self, host: int) -> None: ...


Part = TypeVar("Part")


class RestartInbox:
    def __init__(self) -> None:
        self._driver: Driver | None = None
        self._remedies: Remedies | None = None

    def attach(self, driver: Driver, remedies: Remedies) -> None:
        self._driver, self._remedies = driver, remedies

    async def send(self, event: restart_events.Event) -> RestartState:
        """The event to the restart machine; its state once the event and its commands are done."""
        return await _attached(self._driver).send(event)

    async def fail(self, reason: str) -> None:
        await self.send(restart_events.JobFails(reason))

    async def no_replacement(self, host: int) -> None:
        """No new machine came for `host` in time: the policy decides again, with no spare."""
        await _attached(self._remedies).no_replacement(host)


def _attached(part: Part | None) -> Part:
    if part is None:
        raise RuntimeError("the restart machine's driver is not attached to its inbox yet")
    return part

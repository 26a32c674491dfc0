"""A host's side of an announced loss: telling the leader its machine goes, and saving on notice.

A machine that will go says so to the leader (messages.Notice) as soon as it hears: a chaos
`maintenance` or `preempt` fault locally (supervisor.host.chaos), SIGTERM with the pod's grace in a
cluster. The leader then asks every host to save the same step (messages.SaveAt); each host passes
the request on to its workload (protocol.SAVE_AT), which saves that step and holds. The host whose
machine goes also says once its shard of that step reached its peers (messages.Replicated): the
spare that takes its place restores it from them.
"""

from __future__ import annotations

import asyncio
import time

from slicekeeper.supervisor import messages
from slicekeeper.supervisor.checkpoints.tiers import CheckpointTiers
from slicekeeper.supervisor.host.context import HostContext
from slicekeeper.supervisor.host.sdk_events import SdkEvents

COMMIT_POLL_SECONDS = 0.02
"""How often the noticed host looks whether its workload committed the step saved on notice."""


async def announce(context: HostContext, cause: str, seconds: float, source: str) -> None:
    """This host's machine goes in `seconds`, for `cause` ("maintenance" or "preemption")."""
    at = time.time() + seconds
    context.log({"source": "supervisor", "type": "notice", "cause": cause, "at": at, "notice_source": source})
    context.say(f"{cause} announced ({source}): this machine goes in {seconds:g} s")
    await context.report(messages.Notice(cause=cause, at=at, source=source))  # type: ignore[arg-type]


async def save_on_notice(
    order: messages.SaveAt, context: HostContext, sdk: SdkEvents, tiers: CheckpointTiers
) -> None:
    """Pass the leader's request on to the workload; on the noticed host, say when the saved step
    reached the peers (nothing is said if it does not before the machine goes: the leader's wait
    ends at that deadline on its own)."""
    if not await sdk.request_save(order.generation, order.step):
        context.say(f"no workload of generation {order.generation} to save step {order.step} on notice")
        return
    if order.noticed != context.host:
        return
    while (sdk.last_checkpoint or -1) < order.step:
        if time.time() >= order.until:
            return
        await asyncio.sleep(COMMIT_POLL_SECONDS)
    try:
        await asyncio.wait_for(tiers.drain(), max(0.0, order.until - time.time()))
    except TimeoutError:
        return
    await context.report(messages.Replicated(step=order.step))


SIGTERM_SOURCE = "SIGTERM: the pod is being deleted, with its grace period"
ANSWER_SECONDS = 2.0
"""A member told to stop waits this long for the leader to act on its notice (ask for a save); no
answer (the whole job is being deleted, its leader stopping too): it ends at once."""
GRACE_MARGIN_SECONDS = 2.0
"""Kept back from the pod's grace: the supervisor ends on its own before the kubelet kills it."""


class SigtermNotice:
    """A member's SIGTERM in a cluster (a preemption, a drained node: the pod deleted with its grace):
    a notice of its machine's loss, `grace` seconds ahead (spec.disruption)."""

    def __init__(self, context: HostContext, grace: float) -> None:
        self._context = context
        self._grace = grace
        self.begun = False
        self.answered = asyncio.Event()
        """The leader acted on the notice (asked for a save)."""

    async def hand_over(self, ended: asyncio.Event) -> None:
        """Tell the leader, then wait (within the grace) for its answer and for the host to be taken
        over (this supervisor retired: `ended`); the caller ends the supervisor after."""
        self.begun = True
        await announce(self._context, "preemption", self._grace, SIGTERM_SOURCE)
        try:
            await asyncio.wait_for(self.answered.wait(), ANSWER_SECONDS)
            await asyncio.wait_for(
                ended.wait(), max(0.0, self._grace - GRACE_MARGIN_SECONDS - ANSWER_SECONDS)
            )
        except TimeoutError:
            return

"""Creating many objects at once, as Kubernetes controllers do: concurrently, after a slow start.

A job of 25,000 hosts is 25,000 pod creates. One at a time they are bound by one request's round
trip (about 5 ms against a quiet API server, far more against a busy one); all at once, a quota or
an admission webhook refusing every one of them would cost 25,000 refusals. So, like the ReplicaSet
and Job controllers (`slowStartBatch`): a batch of 1, then 2, 4, 8, ..., each batch's creates made
concurrently, the next batch only once every create of this one succeeded. A batch with a failure
stops the creation: what was created stays, the error reaches the handler, and kopf retries it later
(a create that finds its object there counts as done: 409).

Once a batch reaches `concurrency`, the creates go on as a window of `concurrency` in flight, the
next one sent as soon as one is answered, stopping at the first failure: a batch waits for its
slowest create, and at 64 in flight with 50 ms round trips those waits held 25,000 pods to about 440
a second of the 1,280 the window allows (benchmarks/operator_scale.py).

The creates are coroutines of one event loop (operator/loop_creates.py sends them): as 64 threads,
each answer waited for the interpreter again at every step of its request, and at 50 ms round trips
25,000 pods took 36 s, not the 20 that 64 in flight allow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from itertools import islice
from typing import TypeVar

DEFAULT_CONCURRENCY = 64
"""Creates in flight at once: enough that a 50 ms round trip does not bound 25,000 pods below the rate
limit (64 in flight: about 1,280 a second; 32 was 640, 39 s for 25,000), few enough for one API
server connection pool."""

T = TypeVar("T")


def batches(items: Iterable[T], limit: int) -> Iterator[list[T]]:
    """`items` in batches of 1, 2, 4, ... at most `limit` each."""
    source, size = iter(items), 1
    while batch := list(islice(source, size)):
        yield batch
        size = min(size * 2, limit)


async def create_in_batches(
    items: Iterable[T], create: Callable[[T], Awaitable[bool]], *, concurrency: int
) -> int:
    """Create each of `items` (`create` returns False for one that was there already): slow-start
    batches up to `concurrency`, then a window of `concurrency` in flight; the number created. The
    first failure is raised once the creates in flight are done, and nothing more is sent."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1 (got {concurrency})")
    source = iter(items)
    created = 0
    for batch in batches(source, concurrency):
        created += _answers(await asyncio.gather(*(create(item) for item in batch), return_exceptions=True))
        if len(batch) == concurrency:
            break  # the slow start is over: on as a window
    in_flight: set[asyncio.Future[bool]] = set()
    try:
        for item in source:
            if len(in_flight) >= concurrency:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                created += _answers([_outcome(future) for future in done])
            in_flight.add(asyncio.ensure_future(create(item)))
    finally:
        answered = await asyncio.gather(*in_flight, return_exceptions=True) if in_flight else []
    return created + _answers(answered)


def _outcome(future: asyncio.Future[bool]) -> bool | BaseException:
    error = future.exception()
    return future.result() if error is None else error


def _answers(outcomes: list[bool | BaseException]) -> int:
    """The number created among `outcomes` of creates all done; the first failure among them raised."""
    failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failure is not None:
        raise failure
    return sum(1 for outcome in outcomes if outcome is True)

"""Every call to the persistent tier's store under a deadline, tried a bounded number of times.

The persistent tier (supervisor.checkpoints.persistent_tier) reaches its store through fsspec, in
calls that block. An object store that stops answering (a hung connection, a throttled bucket) would
hold a save, a commit or, worse, a restore for as long as its client waits, which may be for ever. So
the supervisor and the leader never call it directly: `call` runs each call in a thread of the
store's own pool, gives it `call_timeout` seconds, and tries a failed or timed-out call again, up to
`attempts` times with a pause doubling from `BACKOFF_SECONDS` (unless the store answered with an
error no second attempt changes: no permission, a file in the way, a full disk). Then it gives up with
PersistentTierError, naming the call and each attempt's fate, which its callers already handle: an
upload fails with the reason (the step is not persisted, training goes on), a restore's staging
moves on to the next source, a commit is tried again at the next upload.

A call given up keeps its thread until the store answers or the process ends: that is why each call
has a daemon thread of its own rather than one of asyncio's default pool, which a hung store would
fill (the lease's reads and the leader's other work wait there) and whose threads the interpreter
waits for at exit. A hung call's thread writes nothing that a later attempt reads: a download
stages into a folder of its own (PersistentTier.download).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTierError

T = TypeVar("T")

BACKOFF_SECONDS = 1.0
"""The pause before the second attempt of a call; each later one waits twice as long as the one before."""


def _in_a_thread(function: Callable[[], T]) -> asyncio.Future[T]:
    """`function()` in a daemon thread of its own: a call the store never answers holds neither a
    pool's thread nor the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():  # given up meanwhile: its outcome goes nowhere
            outcome()

    def run() -> None:
        try:
            result = function()
        except BaseException as error:
            done = functools.partial(settle, functools.partial(future.set_exception, error))
        else:
            done = functools.partial(settle, functools.partial(future.set_result, result))
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(done)

    threading.Thread(target=run, name="persistent-store", daemon=True).start()
    return future


FINAL_ERRORS = (
    ImportError,
    ValueError,
    PermissionError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
)
"""Causes of a store's failure that no second attempt changes: a missing package or an unknown
protocol, no permission, a file where a folder goes (or the other way round)."""


def _final(error: PersistentTierError) -> bool:
    cause = error.__cause__
    return isinstance(cause, FINAL_ERRORS) or (
        isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT)
    )


class Limits(Protocol):
    """A store's limits on each call (PersistentTier's, from spec.checkpoint.persistent)."""

    call_timeout: float
    attempts: int


async def call(store: Limits, what: str, function: Callable[..., T], *args: object) -> T:
    """`function(*args)` (a method of `store`) under its deadline, tried up to its `attempts` times.
    PersistentTierError once every attempt failed; CorruptCheckpoint and other errors are the data's,
    not the store's, and are raised at once."""
    call_timeout, attempts = store.call_timeout, store.attempts
    fates: list[str] = []
    for attempt in range(1, attempts + 1):
        try:
            async with asyncio.timeout(call_timeout):
                return await _in_a_thread(functools.partial(function, *args))
        except TimeoutError:
            fates.append(f"no answer within {call_timeout:g} s")
        except PersistentTierError as error:
            if _final(error):
                raise  # the store answered, and trying again cannot change its answer
            fates.append(str(error))
        if attempt < attempts:
            await asyncio.sleep(BACKOFF_SECONDS * 2 ** (attempt - 1))
    tried = "; ".join(f"attempt {n}: {fate}" for n, fate in enumerate(fates, 1))
    raise PersistentTierError(f"{what}: gave up after {attempts} attempt(s) ({tried})")

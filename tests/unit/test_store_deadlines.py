"""A persistent store that hangs or fails never hangs the job: every call has a deadline and bounded
retries (supervisor.checkpoints.store_calls), in threads of its own."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import register_implementation
from slicekeeper.supervisor.checkpoints import store_calls
from slicekeeper.supervisor.checkpoints.persistent_tier import PersistentTier, PersistentTierError

from tests.support.shard_folders import make_folder


class HangingFileSystem(MemoryFileSystem):
    """An in-memory store that stops answering while `hung` is set (a hung object store)."""

    protocol = "hanging"
    store: dict[str, Any] = {}
    pseudo_dirs = [""]
    hung = threading.Event()
    released = threading.Event()

    def _wait(self) -> None:
        if self.hung.is_set():
            self.released.wait(30)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._wait()
        return super().info(path, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self._wait()
        return super().ls(path, detail=detail, **kwargs)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        self._wait()
        return super()._open(path, mode, **kwargs)


register_implementation("hanging", HangingFileSystem, clobber=True)


@pytest.fixture
def hanging_store(monkeypatch):
    monkeypatch.setattr(store_calls, "BACKOFF_SECONDS", 0.05)
    HangingFileSystem.released.clear()
    tier = PersistentTier("hanging://bucket", f"job/{uuid.uuid4().hex}", call_timeout=0.3, attempts=2)
    yield tier
    HangingFileSystem.hung.clear()
    HangingFileSystem.released.set()  # the threads given up on end


def test_a_hung_store_fails_an_upload_within_its_deadline_after_its_attempts(hanging_store, tmp_path):
    folder = make_folder(tmp_path, 10, {"leaf0000/0-4": b"x" * 4096})
    HangingFileSystem.hung.set()

    async def upload() -> float:
        began = time.monotonic()
        with pytest.raises(PersistentTierError) as failed:
            await store_calls.call(hanging_store, "upload of step 10", hanging_store.upload, 0, folder)
        assert "upload of step 10: gave up after 2 attempt(s)" in str(failed.value)
        assert str(failed.value).count("no answer within 0.3 s") == 2
        return time.monotonic() - began

    assert asyncio.run(upload()) < 2.0  # 2 x 0.3 s and a pause, not the store's own wait (30 s)
    HangingFileSystem.hung.clear()
    HangingFileSystem.released.set()

    async def again() -> int:  # the store answers again: the same call succeeds
        return await store_calls.call(hanging_store, "upload of step 10", hanging_store.upload, 0, folder)

    assert asyncio.run(again()) > 0


def test_a_hung_store_leaves_the_process_its_threads(hanging_store):
    """Eight listings hang, more than asyncio's pool here holds: the lease's reads and the leader's
    other work still get a thread."""
    HangingFileSystem.hung.set()

    async def main(hang: Any) -> int:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=4))
        hung = [asyncio.create_task(hang()) for _ in range(8)]
        await asyncio.sleep(0.1)
        try:
            return await asyncio.wait_for(asyncio.to_thread(lambda: 42), 1.0)
        finally:
            HangingFileSystem.released.set()
            await asyncio.gather(*hung, return_exceptions=True)

    async def by_store_calls() -> object:
        return await store_calls.call(hanging_store, "listing", hanging_store.committed_owners)

    assert asyncio.run(main(by_store_calls)) == 42


def test_negative_control_in_asyncios_pool_a_hung_store_takes_every_thread(hanging_store):
    HangingFileSystem.hung.set()

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=4))
        hung = [asyncio.create_task(asyncio.to_thread(hanging_store.committed_owners)) for _ in range(8)]
        await asyncio.sleep(0.1)
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(lambda: 42), 1.0)
        finally:
            HangingFileSystem.released.set()
            await asyncio.gather(*hung, return_exceptions=True)

    asyncio.run(main())


class Flaky:
    """A store call that fails `failures` times, then answers."""

    call_timeout, attempts = 1.0, 3

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def listing(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise PersistentTierError(f"503 on call {self.calls}")
        return "listed"


def test_a_store_that_fails_then_answers_is_tried_again(monkeypatch):
    monkeypatch.setattr(store_calls, "BACKOFF_SECONDS", 0.01)
    store = Flaky(failures=2)
    assert asyncio.run(store_calls.call(store, "listing", store.listing)) == "listed" and store.calls == 3
    store = Flaky(failures=3)
    with pytest.raises(PersistentTierError, match="attempt 3: 503 on call 3"):
        asyncio.run(store_calls.call(store, "listing", store.listing))


class InTheWay:
    """A store whose every upload meets a file where its folder goes: the same answer each time."""

    call_timeout, attempts = 1.0, 3

    def __init__(self) -> None:
        self.calls = 0

    def upload(self) -> int:
        self.calls += 1
        try:
            raise NotADirectoryError(20, "Not a directory", "step-00000050")
        except NotADirectoryError as error:
            raise PersistentTierError("store: upload failed: not a directory") from error


def test_an_answer_no_second_attempt_changes_is_not_tried_again():
    store = InTheWay()
    with pytest.raises(PersistentTierError, match="not a directory"):
        asyncio.run(store_calls.call(store, "upload", store.upload))
    assert store.calls == 1

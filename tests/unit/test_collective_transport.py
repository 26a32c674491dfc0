"""The collective transport's event loop (gloo's, on CPU stand-ins) is found and given idle cycles only.

workload/collective_transport.py finds it as a thread started after `TransportThreads()` that waits
in epoll_wait. Here real threads stand in: an event loop started afterwards (found, moved to
SCHED_IDLE), one started before (left alone: gRPC's pollers start before the CPU client), and a
thread started afterwards that waits on a lock, as XLA's compute threads do (left alone).
"""

from __future__ import annotations

import os
import select
import threading

import pytest
from slicekeeper.workload.collective_transport import TransportThreads

pytestmark = pytest.mark.skipif(not TransportThreads.supported(), reason="Linux x86_64/aarch64 only")


class Waiter(threading.Thread):
    """A thread that waits until told to stop, in epoll_wait or on a lock; its native id."""

    def __init__(self, in_epoll: bool) -> None:
        super().__init__(daemon=True)
        self.in_epoll = in_epoll
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        self.ready.set()
        if self.in_epoll:
            poller = select.epoll()
            while not self.stop.is_set():
                poller.poll(0.01)  # the loop's own rhythm: gloo waits 10 ms at a time
            poller.close()
        else:
            self.stop.wait()

    def __enter__(self) -> int:
        self.start()
        self.ready.wait()
        assert self.native_id is not None
        return self.native_id

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join()


def policy(tid: int) -> int:
    return os.sched_getscheduler(tid)


def test_an_event_loop_started_later_gets_idle_cycles_and_nothing_else_changes():
    with Waiter(in_epoll=True) as earlier_loop:
        transport = TransportThreads()
        with Waiter(in_epoll=True) as loop, Waiter(in_epoll=False) as worker:
            assert transport.quiet() == [loop]
            assert policy(loop) == os.SCHED_IDLE
            assert policy(worker) == os.SCHED_OTHER
            assert policy(earlier_loop) == os.SCHED_OTHER
            assert policy(threading.get_native_id()) == os.SCHED_OTHER


def test_without_new_event_loops_nothing_is_changed():
    transport = TransportThreads()
    with Waiter(in_epoll=False) as worker:
        assert transport.quiet() == []
        assert policy(worker) == os.SCHED_OTHER


@pytest.mark.skipif(os.geteuid() != 0, reason="leaving the idle class needs CAP_SYS_NICE")
def test_a_workload_being_stopped_has_its_idle_threads_woken_first():
    from slicekeeper.supervisor.workload_process import wake_idle_threads

    transport = TransportThreads()
    with Waiter(in_epoll=True) as loop, Waiter(in_epoll=False) as worker:
        assert transport.quiet() == [loop]
        assert wake_idle_threads(os.getpid()) == [loop]  # only the idle one
        assert policy(loop) == policy(worker) == os.SCHED_OTHER
        assert wake_idle_threads(os.getpid()) == []  # nothing left to wake

"""The workload SDK: events to the supervisor as JSON lines, and a step's own work, timed, stretched
by a chaos slowdown and pinned to the host's core."""

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from slicekeeper.workload import sdk
from slicekeeper.workload.own_work_core import OwnWorkCore
from slicekeeper.workload.sdk import HostIdentity, Session, StepRecord, WorkClock, connect

from slicekeeper import protocol
from slicekeeper.protocol import Phase
from tests.support.fake_supervisor import WAIT, FakeSupervisor, env_for


@pytest.fixture
def socket_dir():
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer than that.
    with tempfile.TemporaryDirectory(prefix="sk-sdk-") as directory:
        yield Path(directory)


@pytest.fixture
def supervisor(socket_dir):
    server = FakeSupervisor(socket_dir / "supervisor.sock")
    yield server
    server.close()


# --- standalone -----------------------------------------------------------------------------------


def test_without_a_socket_the_session_is_standalone_and_every_call_does_nothing():
    session = connect(env_for(None))
    assert not session.supervised
    with session.phase(Phase.CHECKPOINT_RESTORE):
        pass
    with session.step(1) as record:
        record.loss = 0.5
    session.checkpoint_saved(1)
    session.checkpoint_failed(2, reason="disk full")
    session.checkpoint_restored(1)
    session.done(2, fingerprint="abc")
    session.close()
    assert not session.supervised
    assert session.identity.host == 1


def test_an_empty_socket_variable_means_standalone():
    session = connect(env_for(None, **{protocol.ENV_SOCKET: ""}))
    assert not session.supervised


# --- events on the wire ---------------------------------------------------------------------------


def test_a_supervised_session_says_hello_first(supervisor):
    session = connect(env_for(supervisor.path))
    assert session.supervised
    session.close()
    [hello] = supervisor.messages()
    assert hello["type"] == "hello"
    assert hello["pid"] == os.getpid()
    assert hello["generation"] == 2
    assert isinstance(hello["t"], float)


def test_events_arrive_as_json_lines_in_the_order_they_happened(supervisor):
    session = connect(env_for(supervisor.path))
    with session.phase(Phase.CHECKPOINT_RESTORE):
        session.checkpoint_restored(10)
    with session.step(11) as record:
        record.loss = 0.25
    with session.phase(Phase.CHECKPOINT_SAVE):
        pass
    session.checkpoint_saved(11)
    session.checkpoint_failed(12, reason="disk full")
    session.done(12, fingerprint="f00d")
    session.close()

    messages = supervisor.messages()
    assert all(line.endswith(b"}") and b"\n" not in line for line in supervisor.lines)
    assert [m["type"] for m in messages] == [
        "hello",
        "phase",
        "checkpoint_restored",
        "phase",
        "step_begin",
        "step_end",
        "phase",
        "phase",
        "checkpoint_saved",
        "checkpoint_failed",
        "done",
    ]
    assert [m["phase"] for m in messages if m["type"] == "phase"] == [
        "checkpoint_restore",
        "idle",
        "checkpoint_save",
        "idle",
    ]
    times = [m["t"] for m in messages]
    assert times == sorted(times)


def test_a_step_is_bracketed_by_begin_and_end_with_the_loss(supervisor):
    session = connect(env_for(supervisor.path))
    with session.step(7) as record:
        record.loss = 1.5
        record.extra["tokens"] = 4096
    session.close()
    _hello, begin, end = supervisor.messages()
    assert begin == {"type": "step_begin", "step": 7, "t": begin["t"]}
    assert end == {"type": "step_end", "step": 7, "loss": 1.5, "tokens": 4096, "t": end["t"]}


def test_a_step_without_a_loss_reports_none(supervisor):
    session = connect(env_for(supervisor.path))
    with session.step(3):
        pass
    session.close()
    end = supervisor.messages()[-1]
    assert end["type"] == "step_end"
    assert end["loss"] is None


# --- own work -------------------------------------------------------------------------------------


class FakeClock:
    """Stands in for time.monotonic: returns whatever the test last set."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_work_done_puts_the_seconds_from_the_step_begin_on_the_step_end(supervisor, monkeypatch):
    clock = FakeClock(100.0)
    monkeypatch.setattr(sdk.time, "monotonic", clock)
    session = connect(env_for(supervisor.path))
    with session.step(4) as record:
        clock.now = 102.5  # this host's own computation is done
        record.work_done()
        clock.now = 109.0  # waiting for the other hosts in the all-reduce: not own work
        record.loss = 0.5
    session.close()
    end = supervisor.messages()[-1]
    assert (end["type"], end["step"], end["loss"], end["work"]) == ("step_end", 4, 0.5, 2.5)


@pytest.mark.skipif(not OwnWorkCore.supported(), reason="needs Linux thread affinity")
def test_in_local_mode_the_step_end_names_the_core_own_work_ran_on(supervisor):
    core = max(os.sched_getaffinity(0))
    session = connect(env_for(supervisor.path, **{protocol.ENV_OWN_WORK_CORE: str(core)}))
    with session.step(1) as record:
        record.work_done()
    session.close()
    assert supervisor.messages()[-1]["core"] == core  # the leader compares hosts sharing a core


def test_a_step_that_never_marks_its_work_sends_no_work_field(supervisor):
    session = connect(env_for(supervisor.path))
    with session.step(4) as record:
        record.loss = 0.5
    session.close()
    end = supervisor.messages()[-1]
    assert end["type"] == "step_end"
    assert "work" not in end


def test_work_is_counted_per_step_from_that_steps_own_begin(supervisor, monkeypatch):
    clock = FakeClock(10.0)
    monkeypatch.setattr(sdk.time, "monotonic", clock)
    session = connect(env_for(supervisor.path))
    with session.step(1) as record:
        clock.now = 11.0
        record.work_done()
        clock.now = 20.0
    with session.step(2) as record:
        clock.now = 20.25
        record.work_done()
    with session.step(3):
        clock.now = 30.0
    session.close()
    ends = [m for m in supervisor.messages() if m["type"] == "step_end"]
    assert [end.get("work") for end in ends] == [1.0, 0.25, None]


def test_the_latest_work_mark_of_a_step_counts(monkeypatch):
    clock = FakeClock(7.0)
    monkeypatch.setattr(sdk.time, "monotonic", clock)
    record = StepRecord(1, began=5.0)
    record.work_done()
    clock.now = 8.0
    record.work_done()
    assert record.work == 3.0


def test_a_record_made_outside_a_session_times_from_its_creation(monkeypatch):
    clock = FakeClock(7.0)
    monkeypatch.setattr(sdk.time, "monotonic", clock)
    record = StepRecord(1)
    clock.now = 9.5
    record.work_done()
    assert record.work == 2.5


def test_a_phase_that_raises_still_reports_going_back_to_idle(supervisor):
    session = connect(env_for(supervisor.path))
    with pytest.raises(RuntimeError), session.phase(Phase.DATA_LOADING):
        raise RuntimeError("the data loader broke")
    session.close()
    phases = [m["phase"] for m in supervisor.messages() if m["type"] == "phase"]
    assert phases == ["data_loading", "idle"]


def test_checkpoint_events_carry_step_tier_and_reason(supervisor):
    session = connect(env_for(supervisor.path))
    session.checkpoint_saved(20)
    session.checkpoint_failed(30, tier="remote", reason="OSError(28)")
    session.checkpoint_restored(20)
    session.close()
    _hello, saved, failed, restored = supervisor.messages()
    assert (saved["type"], saved["step"], saved["tier"]) == ("checkpoint_saved", 20, "local")
    assert (failed["type"], failed["step"], failed["tier"], failed["reason"]) == (
        "checkpoint_failed",
        30,
        "remote",
        "OSError(28)",
    )
    assert (restored["type"], restored["step"], restored["tier"]) == ("checkpoint_restored", 20, "local")


def test_done_carries_the_last_step_and_the_fingerprint(supervisor):
    session = connect(env_for(supervisor.path))
    session.done(200, fingerprint="abc123")
    session.close()
    done = supervisor.messages()[-1]
    assert (done["type"], done["step"], done["fingerprint"]) == ("done", 200, "abc123")


def test_programs_names_what_this_start_loaded_and_compiled(supervisor):
    session = connect(env_for(supervisor.path))
    session.programs(loaded=("gather", "apply"), compiled=["local_grads"])
    session.close()
    said = supervisor.messages()[-1]
    assert (said["type"], said["loaded"], said["compiled"]) == (
        "programs",
        ["gather", "apply"],
        ["local_grads"],
    )


def test_a_session_over_a_socket_pair_sends_the_same_lines():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    session = Session(HostIdentity.from_env({}), ours)
    session.checkpoint_saved(5)
    session.close()
    theirs.settimeout(WAIT)
    data = b""
    while chunk := theirs.recv(65536):
        data += chunk
    theirs.close()
    [message] = [json.loads(line) for line in data.splitlines()]
    assert message["type"] == "checkpoint_saved"
    assert message["step"] == 5


def test_when_the_supervisor_goes_away_sends_stop_raising_and_training_goes_on(socket_dir):
    server = FakeSupervisor(socket_dir / "gone.sock", close_at_once=True)
    try:
        session = connect(env_for(server.path))
        assert server.accepted.wait(WAIT)
        server.messages()  # the server end is closed now
        for step in range(1, 50):
            with session.step(step) as record:
                record.loss = 1.0
            session.checkpoint_saved(step)
        assert not session.supervised
        session.done(49, fingerprint="x")
        session.close()
    finally:
        server.close()


def test_a_socket_path_nobody_listens_on_is_an_error(socket_dir):
    with pytest.raises(OSError):
        connect(env_for(socket_dir / "nobody.sock"))


def test_chaos_slow_stretches_the_own_work_of_each_step_from_its_first_step_on(monkeypatch):
    clock = iter([10.0, 10.5, 10.5 + 1.0]).__next__  # begin, work done (0.5 s), after the stretch
    slept: list[float] = []
    monkeypatch.setattr(sdk.time, "monotonic", clock)
    monkeypatch.setattr(sdk.time, "sleep", slept.append)
    identity = HostIdentity.from_env({protocol.ENV_CHAOS_SLOW: "3.0@30"})
    assert identity.slow == (3.0, 30)
    session = Session(identity, None)
    with session.step(30) as record:
        record.work_done()
    assert slept == [pytest.approx(1.0)]  # (3 - 1) x 0.5 s
    assert record.work == pytest.approx(1.5)


def test_on_the_cpu_clock_own_work_is_cpu_time_and_a_wait_off_cpu_does_not_count():
    session = Session(HostIdentity.from_env({}), None)
    with session.step(1, clock=WorkClock.CPU) as record:
        time.sleep(0.2)  # off the CPU: another host's turn on a shared core
        record.work_done()
    assert record.work is not None and record.work < 0.1
    with session.step(2) as wall:
        time.sleep(0.2)
        wall.work_done()
    assert wall.work is not None and wall.work >= 0.2


def test_chaos_slow_on_the_cpu_clock_burns_cpu_time_instead_of_sleeping(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(sdk.time, "sleep", slept.append)
    session = Session(HostIdentity.from_env({protocol.ENV_CHAOS_SLOW: "2.0@1"}), None)
    with session.step(1, clock=WorkClock.CPU) as record:
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:  # 50 ms of own work on the CPU
            pass
        record.work_done()
    assert slept == []
    assert record.work is not None and record.work >= 0.1  # stretched twofold, in CPU seconds


def test_steps_before_the_slowdown_and_unslowed_hosts_are_not_stretched(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(sdk.time, "sleep", slept.append)
    for env, step in (({protocol.ENV_CHAOS_SLOW: "2@30"}, 29), ({protocol.ENV_CHAOS_SLOW: ""}, 5), ({}, 5)):
        with Session(HostIdentity.from_env(env), None).step(step) as record:
            record.work_done()
    assert slept == []


def test_a_hang_due_at_a_steps_begin_holds_the_step_there_after_its_begin_is_sent(monkeypatch):
    """Chaos `hang` as a step begins: the SDK waits there for the supervisor's SIGSTOP, its begin
    already sent, so the stop lands in the step's own work however late the supervisor reads it; the
    other steps, and a process with no hang pending, go straight on."""
    events: list[str] = []
    monkeypatch.setattr(
        Session, "_send", lambda self, event, **fields: events.append(f"{event.value}:{fields.get('step')}")
    )
    monkeypatch.setattr(sdk.time, "sleep", lambda seconds: events.append(f"held {seconds}"))
    session = Session(HostIdentity.from_env({protocol.ENV_CHAOS_HOLD: "10,22"}), None)
    assert session.identity.hold == {10, 22}
    for step in (9, 10):
        with session.step(step) as record:
            record.work_done()
    begin, held = f"{protocol.Event.STEP_BEGIN.value}:10", f"held {protocol.CHAOS_HOLD_SECONDS}"
    assert events.count(held) == 1 and events.index(held) == events.index(begin) + 1, events
    events.clear()
    with Session(HostIdentity.from_env({protocol.ENV_CHAOS_HOLD: ""}), None).step(10) as record:
        record.work_done()
    assert not any(e.startswith("held") for e in events), events


def thread_affinities() -> set[frozenset[int]]:
    found = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            found.add(frozenset(os.sched_getaffinity(int(task))))
    return found


@pytest.mark.skipif(not OwnWorkCore.supported(), reason="needs Linux thread affinity")
def test_in_local_mode_own_work_runs_on_the_hosts_core_and_the_rest_of_the_step_everywhere():
    everywhere = frozenset(os.sched_getaffinity(0))
    core = max(everywhere)
    helper_ready, stop = threading.Event(), threading.Event()
    helper = threading.Thread(target=lambda: (helper_ready.set(), stop.wait()))  # a pool thread, say
    helper.start()
    helper_ready.wait()
    try:
        session = Session(HostIdentity.from_env({protocol.ENV_OWN_WORK_CORE: str(core)}), None)
        assert session.identity.own_work_core == core
        with session.step(1) as record:
            during = thread_affinities()
            record.work_done()
            after = thread_affinities()
        assert during == {frozenset({core})}  # every thread, not only the caller's
        assert after == {everywhere}
        with pytest.raises(RuntimeError), session.step(2):
            raise RuntimeError("the loop broke before work_done()")
        assert thread_affinities() == {everywhere}
    finally:
        stop.set()
        helper.join()


def test_without_a_core_the_threads_are_left_alone():
    before = thread_affinities()
    with Session(HostIdentity.from_env({}), None).step(1) as record:
        assert thread_affinities() == before
        record.work_done()
    assert Session(HostIdentity.from_env({}), None).identity.own_work_core is None

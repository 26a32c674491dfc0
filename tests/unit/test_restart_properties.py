"""Random restarts as a real driver could produce them, against the restart state machine
(supervisor.leader.restart_machine): safety, every command accounted for and liveness checked after
every event, and each way to break the machine that matters run through the same property, which
must catch it.

The model (`Job`) is the driver and its members. The machine's commands are carried out as the driver
does: a stop reaches every live member of the world, which then owes its ack; an ack deadline is a
timer that fires (or is cancelled); a StartGeneration is answered by StartChecked (the driver's way),
or by Started or StartAbandoned (the machine takes those too), or fails the job; LaunchGeneration, or
Started, starts every live host of the world. What the property checks:

- safety: no StartGeneration while a live member of the world still runs its workload (its stop not
  acked, no NoWorkload) or something holds the start (a Hold not released, a replacement awaited);
  never a start while one is under way; each live host of the world started exactly once per
  generation, and never while its workload still runs;
- nothing dropped: the machine counts on its ack deadline exactly while the driver holds a timer for it
  (or its firing waits on the queue), on a start exactly while a StartGeneration awaits its answer,
  and holds exactly what was held and not released; every SendStop and ArmAckDeadline is for the
  generation stopping; an ended job holds no timer and ended once;
- liveness: `pending(state)` whenever the job is not over, and from every state reached, a world that
  behaves (every host back, every hold released without a Reconsider, every stop acked, every start
  checked, every timer firing) brings the job back to running or to its end.

Why a `RuleBasedStateMachine` rather than a list of events drawn up front: what a driver may feed next
depends on what came before (an ack only from a member told to stop, a deadline only while one is
armed, an answer only to a StartGeneration, a Release only of a hold), so each rule's precondition
reads the model: hypothesis builds only sequences a real driver could produce, spends no step on
events the machine rightly ignores, and shrinks a failure to the shortest such story. The driver's own
events (a deadline that fired, the answer to a start) wait on a queue that a rule of its own delivers,
so members overtake them as they may in the leader: the last ack can arrive after the deadline fired.

Found every time: hypothesis runs derandomized and without a database, so each run explores the same
sequences; each mutant in `MUTANTS` runs through the same rules (without shrinking) and must fail for
the reason named next to it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from slicekeeper.supervisor.leader import restart_events as ev
from slicekeeper.supervisor.leader import restart_machine as m
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.restart_state import JobState

from slicekeeper.policy.events import FaultKind

RULE = RestartRule(max_restarts=6, max_without_progress=3)
WORLD = (0, 1, 2)
HOSTS = (0, 1, 2, 3)
"""Host 3 is a spare: registered in some examples, never in the world (no stop, no start)."""
REPLACEMENT = "replacement"
"""A hold the machine does not keep: a replacement on its way (`Readiness.holding`)."""
HOLDS = st.sampled_from(["deciding", "waiting", REPLACEMENT])
ANSWERS = st.sampled_from(["checked", "checked", "checked", "started", "abandoned", "abandoned", "failed"])
"""How a start under way is answered (see `Job.deliver`)."""
BEHAVING_STEPS = 30
"""Deliveries a behaving world needs at most to bring a job back (a few acks, a timer, a start)."""

PROPERTY = settings(
    max_examples=150,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=False,
)
FIND_MUTANT = settings(PROPERTY, phases=[Phase.explicit, Phase.generate])
"""The property's own search, stopped at the first failure (no shrinking: the test needs only one)."""


@dataclass(frozen=True)
class DeadlineFired:
    """The ack deadline armed for `generation` fired; its event waits to be fed."""

    generation: int


@dataclass(frozen=True)
class StartUnderWay:
    """The driver carries out a StartGeneration; its answer waits to be fed."""


Queued = DeadlineFired | StartUnderWay


class Job:
    """One job's driver and members, feeding the machine and carrying out its commands in order."""

    def __init__(self) -> None:
        self.state = m.RestartState()
        self.live: set[int] = set()
        self.held: Counter[str] = Counter()
        """Holds sent to the machine (Hold) and not released yet."""
        self.awaiting = False
        """A replacement is on its way."""
        self.workload: dict[int, int] = {}
        """host -> the generation its workload runs (none: stopped, finished or a new machine)."""
        self.owing: dict[int, int] = {}
        """host -> the generation whose stop it was told and has not acked yet."""
        self.timer: int | None = None
        """The generation the armed ack deadline was armed for."""
        self.queue: deque[Queued] = deque()
        self.starts: Counter[tuple[int, int]] = Counter()
        """(generation, host) -> starts sent."""
        self.ends = 0

    def copy(self) -> Job:
        twin = Job()
        twin.__dict__.update(self.__dict__)
        twin.live, twin.held, twin.workload = set(self.live), Counter(self.held), dict(self.workload)
        twin.owing, twin.queue, twin.starts = dict(self.owing), deque(self.queue), Counter(self.starts)
        return twin

    def holding(self) -> bool:
        return bool(self.held) or self.awaiting

    def readiness(self) -> m.Readiness:
        return m.Readiness(frozenset(self.live), WORLD, self.awaiting)

    # --- what the world does ------------------------------------------------------------------
    def connect(self, host: int) -> None:
        """`host` registers (before the first start) or comes back on a new machine, with nothing running."""
        self.live.add(host)
        if self.state.phase is JobState.REGISTERING:
            if self.live.issuperset(WORLD):
                self.feed(ev.AllRegistered())
            return
        self.feed(ev.NoWorkload(host))
        self.feed(ev.Reconsider(self.readiness()))

    def lose(self, host: int) -> None:
        """`host`'s machine is gone, with its workload; while running, that is a fault."""
        self.live.discard(host)
        self.workload.pop(host, None)
        self.owing.pop(host, None)
        self.feed(ev.MemberLost(host))
        if self.state.phase is JobState.RUNNING and host in WORLD:
            self.feed(ev.FaultStop(host, FaultKind.HOST_LOST, "gone", 1.0, frozenset(self.live), WORLD))

    def ack(self, hosts: set[int]) -> None:
        """`hosts` killed their workloads and ack, one batch per generation they were told to stop."""
        for generation in sorted({self.owing[host] for host in hosts}):
            batch = frozenset(host for host in hosts if self.owing[host] == generation)
            for host in batch:
                del self.owing[host]
                self.workload.pop(host, None)
            self.feed(ev.StopAcked(batch, generation, self.readiness()))

    def hold(self, why: str) -> None:
        if why == REPLACEMENT:
            self.awaiting = True
            return
        self.held[why] += 1
        self.feed(ev.Hold(why))

    def release(self, why: str) -> None:
        """What held the start is done (no Reconsider: the caller decides)."""
        if why == REPLACEMENT:
            self.awaiting = False
            return
        self.held[why] -= 1
        if not self.held[why]:
            del self.held[why]
        self.feed(ev.Release(why))

    def fire(self, at_once: bool) -> None:
        """The ack deadline fires; `at_once`: its event is fed before anything else happens, else it
        waits on the queue (and a member may overtake it)."""
        assert self.timer is not None
        generation, self.timer = self.timer, None
        if at_once:
            self.feed(ev.AckDeadlinePassed(generation, self.readiness(), 30.0))
        else:
            self.queue.append(DeadlineFired(generation))

    def deliver(self, answer: str) -> None:
        """Feed the driver's next own event. A start under way is answered as `answer` says, with the
        facts of now: `checked` (StartChecked: the hosts of the world with no machine), `failed` (the
        persistent tier unreadable before the first start, later the background work failed), and the
        answers the machine also takes: `started` (Started, if no host is missing, else given up) and
        `abandoned` (StartAbandoned; a first start is given up only for a host missing)."""
        queued = self.queue.popleft()
        if isinstance(queued, DeadlineFired):
            self.feed(ev.AckDeadlinePassed(queued.generation, self.readiness(), 30.0))
            return
        first = self.state.phase is JobState.REGISTERING
        missing = tuple(host for host in WORLD if host not in self.live)
        if answer == "abandoned" and first and not missing:
            answer = "checked"
        if answer == "started" and missing:
            answer = "abandoned"
        match answer:
            case "checked":
                self.feed(ev.StartChecked(missing))
            case "failed" if first:
                self.feed(ev.StartChecked(missing, "the persistent tier is unreadable"))
            case "failed":
                self.feed(ev.JobFails("the leader's background work failed"))
            case "abandoned":
                self.feed(ev.StartAbandoned())
            case "started":
                generation = self.state.generation + (0 if first else 1)
                self.feed(ev.Started(generation))
                self.launch(generation)

    def launch(self, generation: int) -> None:
        """Every live host of the world is told to start `generation`."""
        assert (self.state.phase, self.state.generation) == (JobState.RUNNING, generation), self.state
        for host in sorted(self.live.intersection(WORLD)):
            assert self.starts[generation, host] == 0, (
                f"host {host} started twice in generation {generation} (two generations at once)"
            )
            assert host not in self.workload, (
                f"host {host} started in generation {generation} while its workload of generation "
                f"{self.workload[host]} still runs"
            )
            self.starts[generation, host] += 1
            self.workload[host] = generation

    # --- the driver ---------------------------------------------------------------------------
    def feed(self, event: ev.Event) -> None:
        before = self.state
        self.state, commands = m.transition(before, event, RULE)
        for command in commands:
            self.carry_out(command, before)

    def carry_out(self, command: ev.Command, before: m.RestartState) -> None:
        match command:
            case ev.SendStop(generation=generation, to=to):
                assert generation == before.generation, f"a stop of generation {generation} in {before}"
                assert set(to) == self.live.intersection(WORLD), f"a stop to {to}, live {self.live}"
                self.owing.update(dict.fromkeys(to, generation))
            case ev.ArmAckDeadline(generation=generation):
                assert generation == self.state.generation, (
                    f"a deadline armed for {generation} in {self.state}"
                )
                self.timer = generation
            case ev.CancelAckDeadline():
                self.timer = None
            case ev.StartGeneration(first=first):
                assert first == (before.phase is JobState.REGISTERING), f"{command} after {before}"
                self.check_start(before)
                self.queue.append(StartUnderWay())
            case ev.LaunchGeneration(generation=generation, first=first):
                assert first == (before.phase is JobState.REGISTERING), f"{command} after {before}"
                self.launch(generation)
            case ev.EndJob():
                assert self.state.over and self.ends == 0, f"EndJob in {self.state}, {self.ends} before"
                self.ends += 1
            case ev.RecordStop() | ev.WriteJournal():
                pass

    def check_start(self, before: m.RestartState) -> None:
        assert StartUnderWay() not in self.queue and not before.starting, (
            f"a second start while one is under way (two generations at once): {before}"
        )
        if before.phase is not JobState.STOPPING:
            return
        assert not self.holding(), (
            f"a start while something holds it (holds {dict(self.held)}, replacement {self.awaiting})"
        )
        running = sorted(host for host in self.live.intersection(WORLD) if host in self.workload)
        assert not running, f"a start before the last ack: host(s) {running} still run their workload"

    # --- liveness -----------------------------------------------------------------------------
    def behave(self) -> None:
        """Let the world behave until the job runs or ends; AssertionError if it cannot get there."""
        for host in sorted(set(WORLD) - self.live):
            self.connect(host)
        for why in [*self.held.elements(), *([REPLACEMENT] if self.awaiting else [])]:
            self.release(why)
        for _ in range(BEHAVING_STEPS):
            if self.state.over or self.state.phase is JobState.RUNNING:
                return
            if self.owing:
                self.ack(set(self.owing))
            elif self.queue:
                self.deliver("checked")
            elif self.timer is not None:
                self.fire(at_once=True)
            else:
                break
        raise AssertionError(f"stuck: a behaving world cannot bring the job back: {self.state}")


class RestartSequences(RuleBasedStateMachine):
    """Random steps of the world around one `Job` at a time (a new one once a job is over)."""

    def __init__(self) -> None:
        super().__init__()
        self.job = Job()

    @initialize(
        hosts=st.one_of(st.just(set(WORLD)), st.just(set(HOSTS)), st.sets(st.sampled_from(HOSTS))),
        started=st.sampled_from([True, True, True, False]),
    )
    def register(self, hosts: set[int], started: bool) -> None:
        """`hosts` register; `started`: the first start, if one is under way, is checked (most examples
        begin with a running job)."""
        self.begin(hosts, started)

    @precondition(lambda self: self.job.state.over)
    @rule()
    def next_job(self) -> None:
        self.begin(set(WORLD), started=True)

    def begin(self, hosts: set[int], started: bool) -> None:
        self.job = Job()
        for host in sorted(hosts):
            self.job.connect(host)
        if started and self.job.queue:
            self.job.deliver("checked")

    @precondition(lambda self: not self.job.state.over)
    @rule(host=st.sampled_from(WORLD))
    def lose_or_connect(self, host: int) -> None:
        """A host of the world is lost, or, lost before, comes back (one rule: neither crowds out others)."""
        if host in self.job.live:
            self.job.lose(host)
        else:
            self.job.connect(host)

    @precondition(lambda self: self.job.state.phase is JobState.RUNNING and self.job.live)
    @rule(
        data=st.data(),
        kind=st.sampled_from([FaultKind.CRASH, FaultKind.HANG]),
        planned=st.booleans(),
        decide=st.booleans(),
    )
    def fault(self, data: st.DataObject, kind: FaultKind, planned: bool, decide: bool) -> None:
        """A fault on a live host; `decide`: a decision on it holds the start from now on."""
        host = data.draw(st.sampled_from(sorted(self.job.live)), label="host")
        if decide:
            self.job.hold("deciding")
        self.job.feed(ev.FaultStop(host, kind, "x", 1.0, frozenset(self.job.live), WORLD, planned))

    @precondition(lambda self: not self.job.state.over and self.job.owing)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        """Hosts told to stop ack: all of them in one batch, or some."""
        owing = sorted(self.job.owing)
        some = st.sets(st.sampled_from(owing), min_size=1)
        self.job.ack(data.draw(st.one_of(st.just(set(owing)), some), label="hosts"))

    @precondition(lambda self: self.job.state.phase is JobState.STOPPING)
    @rule(why=HOLDS)
    def hold(self, why: str) -> None:
        """Something holds the start: a decision under way, a policy's Wait, a replacement on its way."""
        self.job.hold(why)

    @precondition(lambda self: not self.job.state.over and self.job.holding())
    @rule(
        data=st.data(), outcome=st.sampled_from(["reconsider", "silently", "reconsider", "silently", "fail"])
    )
    def release(self, data: st.DataObject, outcome: str) -> None:
        """What held the start is done, and the driver reconsiders, or it went without a word; or the
        decision fails the job."""
        if outcome == "fail":
            self.job.feed(ev.JobFails("the policy said so"))
            return
        held = sorted({*self.job.held, *([REPLACEMENT] if self.job.awaiting else [])})
        self.job.release(data.draw(st.sampled_from(held), label="why"))
        if outcome == "reconsider":
            self.job.feed(ev.Reconsider(self.job.readiness()))

    @precondition(lambda self: self.job.state.phase is JobState.RUNNING)
    @rule()
    def progress(self) -> None:
        self.job.feed(ev.Progressed())

    @precondition(
        lambda self: (
            self.job.state.phase is JobState.RUNNING
            and self.job.state.generation in self.job.workload.values()
        )
    )
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        generation = self.job.state.generation
        training = sorted(host for host, running in self.job.workload.items() if running == generation)
        host = data.draw(st.sampled_from(training), label="host")
        del self.job.workload[host]
        self.job.feed(ev.HostFinished(host, generation, WORLD))

    @precondition(lambda self: not self.job.state.over and self.job.timer is not None)
    @rule(at_once=st.booleans())
    def deadline_fires(self, at_once: bool) -> None:
        self.job.fire(at_once)

    @precondition(lambda self: not self.job.state.over and self.job.queue)
    @rule(answer=ANSWERS)
    def deliver(self, answer: str) -> None:
        self.job.deliver(answer)

    @invariant()
    def commands_are_all_accounted_for(self) -> None:
        job, state = self.job, self.job.state
        if state.over:
            assert job.timer is None, f"an ended job left its ack deadline armed: {state}"
            assert job.ends == 1, f"a job ended {job.ends} times"
            return
        if job.timer is not None:
            assert state.ack_deadline, f"an ack deadline armed that the machine does not count on: {state}"
        elif state.ack_deadline:
            assert DeadlineFired(state.generation) in job.queue, (
                f"the machine counts on an ack deadline nobody armed: {state}"
            )
        under_way = StartUnderWay() in job.queue
        assert state.starting == under_way, (
            f"starting {state.starting}, a start under way {under_way}: {state}"
        )
        assert Counter(state.holds) == job.held, (
            f"the machine holds {state.holds}, the driver {dict(job.held)}"
        )

    @invariant()
    def pending_whenever_not_over(self) -> None:
        state = self.job.state
        assert state.over or m.pending(state), f"stuck: nothing pending in {state}"

    @invariant()
    def world_that_behaves_brings_the_job_back(self) -> None:
        self.job.copy().behave()


def test_random_restarts_a_driver_could_produce_keep_every_rule_of_safety_and_liveness() -> None:
    run_state_machine_as_test(RestartSequences, settings=PROPERTY)


# --- negative controls: mutants of the machine, run through the same property --------------------

TRANSITION, DEADLINE, ABANDON, START_IF_READY, END = (
    m.transition,
    m._deadline,
    m._abandon,
    m._start_if_ready,
    m._end,
)


def deadline_not_rearmed_for_a_hold(state: m.RestartState, event: ev.AckDeadlinePassed) -> m.Outcome:
    """Every ack in, the start waiting for a hold: the state keeps its deadline, no ArmAckDeadline."""
    after, commands = DEADLINE(state, event)
    return (after, []) if commands == [ev.ArmAckDeadline(state.generation)] else (after, commands)


def deadline_dropped_for_a_hold(state: m.RestartState, event: ev.AckDeadlinePassed) -> m.Outcome:
    """Every ack in, the start waiting for a hold: the deadline forgotten altogether."""
    after, commands = DEADLINE(state, event)
    if commands == [ev.ArmAckDeadline(state.generation)]:
        return dataclasses.replace(after, ack_deadline=False), []
    return after, commands


def abandoned_start_not_rearmed(state: m.RestartState) -> m.Outcome:
    """A start given up while stopping waits again with no deadline."""
    after, commands = ABANDON(state)
    kept: list[ev.Command] = [command for command in commands if not isinstance(command, ev.ArmAckDeadline)]
    return dataclasses.replace(after, ack_deadline=state.ack_deadline), kept


def start_ignoring_the_last_host(state: m.RestartState, readiness: m.Readiness) -> m.Outcome:
    """The start condition reads every host of the world but the last."""
    return START_IF_READY(state, dataclasses.replace(readiness, world=readiness.world[:-1]))


def start_ignoring_holds(state: m.RestartState, readiness: m.Readiness) -> m.Outcome:
    after, commands = START_IF_READY(
        dataclasses.replace(state, holds=()), dataclasses.replace(readiness, holding=False)
    )
    return dataclasses.replace(after, holds=state.holds), commands


def start_while_one_is_under_way(state: m.RestartState, readiness: m.Readiness) -> m.Outcome:
    after, commands = START_IF_READY(dataclasses.replace(state, starting=False), readiness)
    return (after, commands) if commands else (state, [])


def release_of_every_hold_of_a_kind(state: m.RestartState, event: ev.Event, rule: RestartRule) -> m.Outcome:
    """A Release lets go of every hold of its kind, not one."""
    if isinstance(event, ev.Release) and not state.over:
        return dataclasses.replace(state, holds=tuple(why for why in state.holds if why != event.why)), []
    return TRANSITION(state, event, rule)


def end_leaving_the_deadline_armed(
    state: m.RestartState, *, succeeded: bool, reason: str | None = None
) -> m.Outcome:
    ended, commands = END(state, succeeded=succeeded, reason=reason)
    return ended, [command for command in commands if not isinstance(command, ev.CancelAckDeadline)]


@dataclass(frozen=True)
class Mutant:
    name: str
    replaces: str
    """The function of restart_machine it stands in for."""
    variant: Callable[..., Any]
    caught_as: str
    """What the property says when it fails (a regular expression)."""


MUTANTS = [
    Mutant("deadline-not-rearmed", "_deadline", deadline_not_rearmed_for_a_hold, "nobody armed"),
    Mutant("deadline-dropped", "_deadline", deadline_dropped_for_a_hold, "stuck"),
    Mutant("abandoned-start-not-rearmed", "_abandon", abandoned_start_not_rearmed, "stuck"),
    Mutant(
        "start-before-the-last-ack", "_start_if_ready", start_ignoring_the_last_host, "before the last ack"
    ),
    Mutant("start-while-held", "_start_if_ready", start_ignoring_holds, "while something holds it"),
    Mutant("two-starts-at-once", "_start_if_ready", start_while_one_is_under_way, "two generations at once"),
    Mutant("release-of-every-hold", "transition", release_of_every_hold_of_a_kind, "holds"),
    Mutant("end-keeps-the-deadline", "_end", end_leaving_the_deadline_armed, "left its ack deadline armed"),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.name for mutant in MUTANTS])
def test_the_property_catches_each_mutant_of_the_machine(
    mutant: Mutant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(m, mutant.replaces, mutant.variant)
    with pytest.raises(AssertionError, match=mutant.caught_as):
        run_state_machine_as_test(RestartSequences, settings=FIND_MUTANT)

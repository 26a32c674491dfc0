"""The restart state machine as pure transitions: `transition(state, event, rule) -> (state, commands)`.

Every host of a job restarts together, in a generation all agree on:

    REGISTERING --every host registered--> (StartGeneration) --Started--> RUNNING(0)
    RUNNING(g) --a fault--> STOPPING(g): every member kills its workload and acks `stopped`
    STOPPING(g) --all live active members acked, nothing holds the start--> (StartGeneration)
               --Started(g+1)--> RUNNING(g+1)
    RUNNING(g) --every active host finished--> SUCCEEDED
    any state but an end --a limit reached (leader.restart_rule), a decision to fail, a stop not
               acked in time, background work that failed--> FAILED

No asyncio, socket, file or clock in here: the facts a transition needs (who is connected, which hosts
take part, whether a decision still holds the start) come in the event, and what must be done (write
the journal, tell the members, arm or cancel the ack deadline, start a generation, end the job) goes
out as commands, which the driver (leader.generations) carries out in order, feeding what they lead
to back in as events. What the event's sender must do goes out as requests, handed back to it
(`Generations.ask`): the rules that depend on the job's phase (a lost host, a registration, a member
back, a decision's steps, returned capacity) are decided here, not by the parts that carry them out.
The fleet simulator drives the same transitions with simulated time.

Liveness: while STOPPING, the ack deadline stays armed until a start is under way, so a job whose
start condition was met while nothing was left to notice it (every ack in, the last decision gone)
is looked at again when the deadline passes; it can never sit stopped with nothing pending.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slicekeeper.supervisor.leader import admission, remedies
from slicekeeper.supervisor.leader.restart_events import (
    AckDeadlinePassed,
    Admit,
    AllRegistered,
    ArmAckDeadline,
    CancelAckDeadline,
    CapacityOffered,
    Carry,
    Command,
    Decided,
    DecideOnLoss,
    EndJob,
    Event,
    FaultStop,
    Hold,
    HostFinished,
    HostLost,
    JobFails,
    Joins,
    LaunchGeneration,
    MemberLost,
    NoteLoss,
    NoWorkload,
    OfferCapacity,
    Progressed,
    Reconsider,
    RecordStop,
    Registered,
    Release,
    Request,
    Returns,
    SendStop,
    ServeAgain,
    StandIn,
    StartAbandoned,
    StartChecked,
    Started,
    StartGeneration,
    StopAcked,
    TookOver,
    WriteJournal,
)
from slicekeeper.supervisor.leader.restart_rule import RestartRule
from slicekeeper.supervisor.leader.restart_state import DECIDING, JobState, Readiness, RestartState

from slicekeeper.policy.events import FaultKind

# --- transitions --------------------------------------------------------------------------------

Outcome = tuple[RestartState, list[Command | Request]]


def transition(state: RestartState, event: Event, rule: RestartRule) -> Outcome:
    """The state after `event`, and what the driver must do (commands) and what the event's sender
    must (requests), in order."""
    match event:  # a registration is answered whatever the phase, an ended job's too
        case Joins(joining=joining):
            return state, [Admit(admission.admit(state.phase, joining))]
    if state.over:
        return state, []  # an ended job changes no more
    match event:
        case FaultStop():
            return _stop(state, event, rule)
        case StopAcked(hosts=hosts, generation=generation, readiness=readiness):
            if state.phase is not JobState.STOPPING or generation != state.generation:
                return state, []
            return _start_if_ready(dataclasses.replace(state, stopped=state.stopped | hosts), readiness)
        case NoWorkload(host=host):
            if state.phase is not JobState.STOPPING:
                return state, []
            return dataclasses.replace(state, stopped=state.stopped | {host}), []
        case MemberLost(host=host):
            return dataclasses.replace(state, stopped=state.stopped - {host}), []
        case Reconsider(readiness=readiness):
            return _start_if_ready(state, readiness)
        case AckDeadlinePassed():
            return _deadline(state, event)
        case Started(generation=generation):
            return _started(state, generation), []
        case StartChecked():
            return _checked(state, event)
        case Hold(why=why):
            return dataclasses.replace(state, holds=(*state.holds, why)), []
        case Release(why=why):
            if why not in state.holds:
                return state, []
            holds = list(state.holds)
            holds.remove(why)
            return dataclasses.replace(state, holds=tuple(holds)), []
        case StartAbandoned():
            return _abandon(state)
        case AllRegistered():
            if state.phase is not JobState.REGISTERING or state.starting:
                return state, []  # a second call while the first start reads the persistent tier
            return dataclasses.replace(state, starting=True), [StartGeneration(first=True)]
        case Progressed():
            if state.phase is not JobState.RUNNING:
                return state, []
            return dataclasses.replace(state, progressed=True), []
        case HostFinished(host=host, generation=generation, world=world):
            if state.phase is not JobState.RUNNING or generation != state.generation:
                return state, []
            finished = state.finished | {host}
            if len(finished) >= len(world) and set(world) <= finished:
                return _end(dataclasses.replace(state, finished=finished), succeeded=True)
            return dataclasses.replace(state, finished=finished), []
        case TookOver(kind=kind, members=members):
            if state.phase is not JobState.STOPPING or kind is None:
                return state, []
            return state, [SendStop(state.generation, kind, None, members)]
        case JobFails(reason=reason):
            return _end(state, succeeded=False, reason=reason)
        case HostLost():
            return _host_lost(state, event, rule)
        case Registered(members=members, full_hosts=full_hosts, back=facts):
            if admission.all_registered(state.phase, members, full_hosts):
                return transition(state, AllRegistered(), rule)
            if state.phase is JobState.REGISTERING:
                return state, []
            return state, [ServeAgain(admission.back(state.phase, facts))]  # a supervisor restarted
        case Returns(back=facts):
            return state, [ServeAgain(admission.back(state.phase, facts))]
        case Decided(event=decided, action=action):
            return state, [Carry(remedies.intents(decided, action, state.phase))]
        case CapacityOffered():
            trains = state.phase is JobState.RUNNING and state.progressed and not state.held(DECIDING)
            return state, [OfferCapacity()] if trains else []


def _stop(state: RestartState, event: FaultStop, rule: RestartRule) -> Outcome:
    if state.phase is not JobState.RUNNING:
        return state, []  # stopping already, or not started: one stop per generation
    without = rule.without_progress(state.restarts_without_progress, state.progressed, event.planned)
    counted = dataclasses.replace(state, restarts_without_progress=without)
    fault = f"{event.kind} on host {event.host} ({event.detail})"
    refusal = None if event.planned else rule.refusal(without, state.restarts, fault)
    record = RecordStop(
        event.host, event.kind, event.detail, event.planned, refusal is not None, state.generation, event.t
    )
    if refusal is not None:
        failed, ending = _end(counted, succeeded=False, reason=refusal)
        return failed, [record, *ending]
    stopping = dataclasses.replace(
        counted,
        phase=JobState.STOPPING,
        stopped=frozenset(),
        restarts=state.restarts + 1,
        ack_deadline=True,
    )
    # Set operations, not a loop in Python: at 25,000 hosts a stop costs a few milliseconds less,
    # which the fleet simulator pays once per simulated failure.
    live = event.live
    to = event.world if live.issuperset(event.world) else tuple(h for h in event.world if h in live)
    stop = SendStop(state.generation, event.kind, None if event.planned else event.host, to)
    return stopping, [record, WriteJournal(), stop, ArmAckDeadline(state.generation)]


def _host_lost(state: RestartState, event: HostLost, rule: RestartRule) -> Outcome:
    if state.phase is JobState.RUNNING:
        fault = FaultStop(event.host, FaultKind.HOST_LOST, event.detail, event.t, event.live, event.world)
        stopped, commands = _stop(state, fault, rule)
        decide = [DecideOnLoss(event.host)] if stopped.phase is JobState.STOPPING else []
        return stopped, [*commands, *decide]
    noted = NoteLoss(event.host, event.detail)
    if state.phase is JobState.REGISTERING:  # nothing trained yet: a new machine stands in
        return state, [noted, StandIn(event.host)]
    return state, [noted, DecideOnLoss(event.host)]


def _started(state: RestartState, generation: int) -> RestartState:
    return dataclasses.replace(
        state,
        phase=JobState.RUNNING,
        generation=generation,
        starting=False,
        progressed=False,
        finished=frozenset(),
        ack_deadline=False,
    )


def _checked(state: RestartState, event: StartChecked) -> Outcome:
    """A commanded start: run the next generation (the first one: the generation the job is in), or
    give it up (a first start with a host lost meanwhile waits for the next registration), or fail."""
    if not state.starting:
        return state, []
    first = state.phase is JobState.REGISTERING
    if event.unreadable is not None:
        return _end(state, succeeded=False, reason=event.unreadable)
    if event.missing and first:
        return _abandon(state)  # a host lost while the persistent tier was read
    if event.missing:
        reason = (
            f"host(s) {list(event.missing)} have no machine, and the policy decided neither a "
            "replacement nor a scale-down for them"
        )
        return _end(state, succeeded=False, reason=reason)
    generation = state.generation if first else state.generation + 1
    return _started(state, generation), [LaunchGeneration(generation, first)]


def _abandon(state: RestartState) -> Outcome:
    """The start cannot be made yet: the next registration or decision starts it."""
    if state.phase is JobState.STOPPING:  # waits again, under its deadline
        return dataclasses.replace(state, starting=False, ack_deadline=True), [
            ArmAckDeadline(state.generation)
        ]
    return dataclasses.replace(state, starting=False), []


def _start_if_ready(state: RestartState, readiness: Readiness) -> Outcome:
    """Start once every live active member acked its stop and nothing holds the start."""
    if state.phase is not JobState.STOPPING or state.starting or readiness.holding or state.holds:
        return state, []
    if not readiness.live.intersection(readiness.world) <= state.stopped:
        return state, []
    starting = dataclasses.replace(state, starting=True, ack_deadline=False)
    return starting, [CancelAckDeadline(), StartGeneration(first=False)]


def _deadline(state: RestartState, event: AckDeadlinePassed) -> Outcome:
    if state.phase is not JobState.STOPPING or event.generation != state.generation or state.starting:
        return state, []
    readiness = event.readiness
    missing = sorted({h for h in readiness.world if h in readiness.live} - state.stopped)
    if missing:
        reason = f"host(s) {missing} did not stop their workload within {event.seconds:.0f} s"
        return _end(state, succeeded=False, reason=reason)
    # Every ack is in and the start waits for a decision (a policy's Wait, a replacement): look again
    # when the deadline passes next, and now, in case what held the start went without a word.
    rearmed = dataclasses.replace(state, ack_deadline=True)
    ready, commands = _start_if_ready(rearmed, readiness)
    return ready, commands or [ArmAckDeadline(state.generation)]


def _end(state: RestartState, *, succeeded: bool, reason: str | None = None) -> Outcome:
    phase = JobState.SUCCEEDED if succeeded else JobState.FAILED
    ended = dataclasses.replace(state, phase=phase, failure_reason=reason, ack_deadline=False, starting=False)
    commands: list[Command] = [CancelAckDeadline()] if state.ack_deadline else []
    return ended, [*commands, EndJob(succeeded, reason)]


def pending(state: RestartState) -> bool:
    """Something will move the job on by itself: an end, training under way, members awaited, a
    timer armed or a start commanded. False is a stuck job."""
    if state.over or state.phase in (JobState.RUNNING, JobState.REGISTERING):
        return True
    return state.ack_deadline or state.starting


def replay(state: RestartState, events: Sequence[Event], rule: RestartRule) -> Outcome:
    """Apply `events` in order (tests and the simulator): the last state and every command."""
    commands: list[Command | Request] = []
    for event in events:
        state, more = transition(state, event, rule)
        commands.extend(more)
    return state, commands

"""The --chaos grammar: KIND:key=value,...@step=S, comma-separated."""

import re

import pytest

from slicekeeper.chaos import ChaosKind, Fault, check_hosts, parse_chaos
from slicekeeper.errors import UserError
from slicekeeper.policy.events import FaultKind


def test_the_issue_example_parses_into_two_faults():
    faults = parse_chaos("kill:host=1@step=30,hang:host=0@step=60")
    assert faults == [Fault(ChaosKind.KILL, 30, {"host": "1"}), Fault(ChaosKind.HANG, 60, {"host": "0"})]
    assert [f.host for f in faults] == [1, 0]
    assert str(faults[0]) == "kill:host=1@step=30"


def test_an_empty_spec_is_no_faults():
    assert parse_chaos(None) == []
    assert parse_chaos("  ") == []


def test_spaces_and_case_are_tolerated():
    assert parse_chaos(" KILL:host=2@step=5 , hang:host=1@step=9") == [
        Fault(ChaosKind.KILL, 5, {"host": "2"}),
        Fault(ChaosKind.HANG, 9, {"host": "1"}),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("explode:host=1@step=3", "unknown fault kind 'explode'"),
        ("kill host=1@step=3", "expected KIND:host=H@step=S"),
        ("kill:host=1", "missing '@step=S'"),
        ("kill:host=1@time=3", "the trigger must be '@step=S'"),
        ("kill:host=1@step=x", "the trigger must be '@step=S'"),
        ("kill:host=1@step=0", "step must be at least 1"),
        ("kill:@step=3", "missing host="),
        ("kill:host=a@step=3", "host must be a host index"),
        ("kill:host=1,color=red@step=3", "unknown argument(s) color"),
        ("kill:host=1,host=2@step=3", "argument 'host' given twice"),
        ("kill:host=@step=3", "argument 'host' has no value"),
    ],
)
def test_a_malformed_spec_names_the_fault_and_the_problem(spec, message):
    with pytest.raises(UserError) as caught:
        parse_chaos(spec)
    assert message in str(caught.value)
    assert str(caught.value).startswith("--chaos: fault")


def test_a_host_that_does_not_exist_is_refused():
    with pytest.raises(UserError, match="names host 4, but the job has 4 hosts"):
        check_hosts(parse_chaos("kill:host=4@step=3"), 4)
    check_hosts(parse_chaos("kill:host=3@step=3"), 4)


# --- lose and corrupt -----------------------------------------------------------------------------


def test_lose_and_corrupt_parse_like_the_other_kinds():
    faults = parse_chaos("lose:host=2@step=40,corrupt:host=1@step=25")
    assert faults == [Fault(ChaosKind.LOSE, 40, {"host": "2"}), Fault(ChaosKind.CORRUPT, 25, {"host": "1"})]
    assert [str(f) for f in faults] == ["lose:host=2@step=40", "corrupt:host=1@step=25"]
    assert [f.host for f in faults] == [2, 1]


def test_every_kind_round_trips_through_its_text():
    spec = (
        "kill:host=1@step=3,hang:host=2@step=4,lose:host=3@step=5,corrupt:host=0@step=6,"
        "crash-supervisor:host=0@step=7"
    )
    assert ",".join(str(f) for f in parse_chaos(spec)) == spec


def test_a_supervisor_crash_aims_at_one_host_any_of_them():
    [fault] = parse_chaos("crash-supervisor:host=0@step=12")
    assert (fault.kind, fault.host, fault.step) == (ChaosKind.CRASH_SUPERVISOR, 0, 12)
    check_hosts([fault], 4)
    with pytest.raises(UserError, match="missing host="):
        parse_chaos("crash-supervisor:@step=3")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lose:@step=3", "missing host="),
        ("corrupt:host=1,bytes=4@step=3", "unknown argument(s) bytes for corrupt"),
        ("lose:host=x@step=3", "host must be a host index"),
    ],
)
def test_lose_and_corrupt_need_exactly_a_host(spec, message):
    with pytest.raises(UserError) as caught:
        parse_chaos(spec)
    assert message in str(caught.value)


def test_losing_any_host_is_accepted_the_leaders_host_included():
    check_hosts(parse_chaos("lose:host=0@step=10"), 4)
    check_hosts(
        parse_chaos("lose:host=1@step=10,kill:host=0@step=5,corrupt:host=0@step=7,hang:host=0@step=9"), 2
    )


def test_a_lost_host_that_does_not_exist_is_refused_as_such():
    with pytest.raises(UserError, match="names host 2, but the job has 2 hosts"):
        check_hosts(parse_chaos("lose:host=2@step=10"), 2)


# --- slow and spare -------------------------------------------------------------------------------


def test_slow_carries_a_host_and_a_factor():
    (fault,) = parse_chaos("slow:host=2,factor=2@step=30")
    assert fault == Fault(ChaosKind.SLOW, 30, {"host": "2", "factor": "2"})
    assert (fault.host, fault.factor, fault.targets_host) == (2, 2.0, True)
    assert str(fault) == "slow:host=2,factor=2@step=30"
    assert parse_chaos("slow:factor=1.5,host=0@step=3")[0].factor == 1.5


def test_slow_is_followed_by_further_faults():
    faults = parse_chaos("slow:host=2,factor=1.5@step=30,kill:host=1@step=40")
    assert [f.kind for f in faults] == [ChaosKind.SLOW, ChaosKind.KILL]
    assert faults[0].args == {"host": "2", "factor": "1.5"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("slow:host=2,factor=0.5@step=3", "factor must be a finite number greater than 1"),
        ("slow:host=2,factor=1@step=3", "factor must be a finite number greater than 1"),
        ("slow:host=2,factor=inf@step=3", "factor must be a finite number greater than 1"),
        ("slow:host=2,factor=abc@step=3", "factor must be a number greater than 1, not 'abc'"),
        ("slow:host=2@step=3", "missing factor="),
        ("slow:factor=2@step=3", "missing host="),
        ("slow:host=x,factor=2@step=3", "host must be a host index"),
        ("slow:host=1,factor=2,speed=3@step=3", "unknown argument(s) speed for slow"),
    ],
)
def test_a_malformed_slow_fault_says_what_is_wrong(spec, message):
    with pytest.raises(UserError) as caught:
        parse_chaos(spec)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"--chaos: fault '{spec}'")


def test_spare_adds_capacity_to_the_job_and_aims_at_no_host():
    (fault,) = parse_chaos("spare:+1@step=80")
    assert fault == Fault(ChaosKind.SPARE, 80, {"value": "+1"})
    assert (fault.count, fault.targets_host) == (1, False)
    assert str(fault) == "spare:+1@step=80"
    assert parse_chaos("spare: +3 @step=9")[0].count == 3


def test_a_hostless_fault_refuses_to_name_a_host_and_is_aimed_at_nobody():
    (spare,) = parse_chaos("spare:+2@step=80")
    with pytest.raises(ValueError, match="aims at no host"):
        _ = spare.host
    assert not any(spare.aimed_at(host) for host in (None, -1, 0, 1))


def test_picking_the_faults_of_one_host_skips_job_faults_and_a_spare_without_a_host():
    faults = parse_chaos("lose:host=3@step=40,spare:+1@step=80,slow:host=2,factor=2@step=30")
    assert [str(f) for f in faults if f.aimed_at(3)] == ["lose:host=3@step=40"]
    assert [str(f) for f in faults if f.aimed_at(2)] == ["slow:host=2,factor=2@step=30"]
    assert [f for f in faults if f.aimed_at(None)] == []


def test_only_slow_has_a_factor_and_only_spare_a_count():
    kill, spare = parse_chaos("kill:host=1@step=3,spare:+1@step=4")
    with pytest.raises(ValueError, match="no slowdown factor"):
        _ = kill.factor
    with pytest.raises(ValueError, match="adds no spares"):
        _ = kill.count
    with pytest.raises(ValueError, match="no slowdown factor"):
        _ = spare.factor


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("spare:@step=3", "missing the value (e.g. spare:+1@step=S)"),
        ("spare:1@step=3", "expected spare:+N@step=S"),
        ("spare:+0@step=3", "expected spare:+N@step=S"),
        ("spare:+x@step=3", "expected spare:+N@step=S"),
        ("spare:+1,host=2@step=3", "unknown argument(s) host for spare"),
        ("spare:+1,+2@step=3", "more than one bare value"),
        ("kill:host=1,+2@step=3", "unknown argument(s) a bare value '+2' for kill"),
    ],
)
def test_a_malformed_spare_fault_says_what_is_wrong(spec, message):
    with pytest.raises(UserError) as caught:
        parse_chaos(spec)
    assert message in str(caught.value)


def test_the_issue_acceptance_specs_pass_the_host_check():
    check_hosts(parse_chaos("lose:host=3@step=40,spare:+1@step=80"), 4)
    check_hosts(parse_chaos("slow:host=2,factor=2@step=30"), 4)
    with pytest.raises(UserError, match="names host 4, but the job has 4 hosts"):
        check_hosts(parse_chaos("spare:+1@step=5,slow:host=4,factor=2@step=30"), 4)


def test_slow_and_spare_round_trip_with_the_other_kinds():
    spec = "slow:host=1,factor=2.5@step=3,spare:+2@step=4,kill:host=0@step=5"
    assert ",".join(str(f) for f in parse_chaos(spec)) == spec


def test_only_faults_that_stop_the_workload_are_disruptive():
    # A partition stops the host's part in the job (its workload runs on, heard by nobody).
    disruptive = {
        ChaosKind.KILL,
        ChaosKind.HANG,
        ChaosKind.LOSE,
        ChaosKind.CRASH_SUPERVISOR,
        ChaosKind.PARTITION,
        ChaosKind.MAINTENANCE,  # the machine goes at the end of its notice
        ChaosKind.PREEMPT,
    }
    assert {k for k in ChaosKind if k.disruptive} == disruptive


# --- partition ------------------------------------------------------------------------------------


def test_a_partition_lasts_for_good_or_for_its_seconds():
    forever, healing = parse_chaos("partition:host=1@step=10,partition:host=2,seconds=6.5@step=12")
    assert (forever.kind, forever.host, forever.seconds) == (ChaosKind.PARTITION, 1, None)
    assert (healing.host, healing.step, healing.seconds) == (2, 12, 6.5)
    assert str(healing) == "partition:host=2,seconds=6.5@step=12"
    assert ChaosKind.PARTITION.disruptive and ChaosKind.PARTITION.detected_as is FaultKind.HOST_LOST


# --- announced losses -----------------------------------------------------------------------------


def test_maintenance_and_preemption_carry_how_far_ahead_they_are_announced():
    spec = "maintenance:host=1,notice=8@step=30,preempt:host=2,grace=0.5@step=31"
    maintenance, preemption = parse_chaos(spec)
    assert (maintenance.kind, maintenance.host, maintenance.step) == (ChaosKind.MAINTENANCE, 1, 30)
    assert maintenance.warning == 8.0
    assert (preemption.kind, preemption.host, preemption.warning) == (ChaosKind.PREEMPT, 2, 0.5)
    assert str(preemption) == "preempt:host=2,grace=0.5@step=31"
    for kind in (ChaosKind.MAINTENANCE, ChaosKind.PREEMPT):
        assert kind.detected_as is FaultKind.ANNOUNCED_LOSS
    with pytest.raises(ValueError, match="is not announced"):
        _ = parse_chaos("lose:host=1@step=3")[0].warning


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("maintenance:host=1@step=3", "missing notice=..."),
        ("preempt:host=1@step=3", "missing grace=..."),
        ("preempt:host=1,notice=3@step=3", "missing grace=..."),
        ("maintenance:host=1,notice=0@step=3", "notice must be a finite number greater than 0"),
        ("preempt:host=1,grace=soon@step=3", "grace must be a number of seconds greater than 0, not 'soon'"),
        ("maintenance:host=1,notice=5,grace=5@step=3", "unknown argument(s) grace for maintenance"),
    ],
)
def test_a_malformed_announced_loss_says_what_is_wrong(spec, message):
    with pytest.raises(UserError, match=re.escape(message)):
        parse_chaos(spec)


@pytest.mark.parametrize("seconds", ["0", "-1", "soon", "inf"])
def test_a_partition_of_no_time_is_refused(seconds):
    with pytest.raises(
        UserError, match=f"fault 'partition:host=1,seconds={seconds}@step=3': seconds must be"
    ):
        parse_chaos(f"partition:host=1,seconds={seconds}@step=3")


def test_a_hang_fires_as_its_step_begins_or_inside_its_collective():
    begin, collective = parse_chaos("hang:host=1@step=10,hang:host=2,at=collective@step=12")
    assert (begin.at, collective.at) == ("begin", "collective")
    assert str(collective) == "hang:host=2,at=collective@step=12"
    with pytest.raises(UserError, match="at must be begin or collective, not 'middle'"):
        parse_chaos("hang:host=1,at=middle@step=3")
    with pytest.raises(UserError, match="unknown argument"):
        parse_chaos("kill:host=1,at=collective@step=3")

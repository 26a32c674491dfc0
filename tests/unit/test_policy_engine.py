"""The policy engine deciding: the user's hooks run under a time limit, fallbacks to the default are
explained, budgets are kept, and the engine follows spec.policy and the example policies."""

from pathlib import Path

import pytest

from slicekeeper import api
from slicekeeper.errors import UserError
from slicekeeper.policy import (
    CapacityReturned,
    DecisionSource,
    Fail,
    Hang,
    HostLost,
    Ignore,
    Level,
    ReplaceHost,
    RestartInJob,
    ScaleDown,
    ScaleUp,
    Straggler,
    Wait,
    World,
)
from slicekeeper.policy.default import EscalationLadder
from slicekeeper.policy.engine import BudgetLedger, PolicyEngine, load_policy
from tests.support.policy_files import EXAMPLES, crash, policy_file

WORLD = World(active_slices=(0, 1), full_slices=2, min_slices=1, hosts_per_slice=2, devices_per_host=2)


def engine_for(tmp_path: Path, body: str, **options) -> PolicyEngine:
    return PolicyEngine(load_policy(policy_file(tmp_path, body)), **options)


def facts(**changes):
    return {"now": 1000.0, "step": 40, "generation": 1, "spares": 1, "scores": {}, "world": WORLD, **changes}


# --- deciding ---------------------------------------------------------------------------------------


def test_the_users_hook_decides_and_is_named_in_the_decision(tmp_path):
    engine = engine_for(tmp_path, "def on_host_lost(event, context):\n    return ScaleDown()\n")
    decision, _ = engine.decide(HostLost(host=3, t=999.0, step=40, generation=1), **facts())
    assert (decision.action, decision.source, decision.reason) == (
        ScaleDown(),
        DecisionSource.USER,
        "on_host_lost in policy.py",
    )


def test_events_without_a_user_hook_get_the_default_policys_answer(tmp_path):
    engine = engine_for(tmp_path, "def on_host_lost(event, context):\n    return ScaleDown()\n")
    decision, _ = engine.decide(crash(), **facts())
    assert (decision.action, decision.source) == (RestartInJob(), DecisionSource.DEFAULT)
    assert decision.reason == "default policy (no on_crash in policy.py)"


def test_without_a_user_policy_the_default_decides():
    decision, _ = PolicyEngine().decide(HostLost(host=3, t=999.0, step=40, generation=1), **facts())
    assert (decision.action, decision.source) == (ReplaceHost(host=3), DecisionSource.DEFAULT)


def test_the_catch_all_hook_takes_kinds_without_a_hook_of_their_own(tmp_path):
    engine = engine_for(
        tmp_path,
        """
        def on_event(event, context):
            return Fail(reason=f"caught {event.kind}")
        def on_straggler(event, context):
            return Ignore()
        """,
    )
    assert engine.decide(crash(), **facts())[0].action == Fail(reason="caught crash")
    slow = Straggler(host=1, score=2.0, t=999.0, step=40, generation=1)
    decided, _ = engine.decide(slow, **facts())
    assert (decided.action, decided.reason) == (Ignore(), "on_straggler in policy.py")


def test_the_hook_sees_the_history_budgets_and_facts(tmp_path):
    engine = engine_for(
        tmp_path,
        """
        SEEN = []
        def on_crash(event, context):
            budget = context.left(Level.RESTART)
            SEEN.append((len(context.history), budget, context.spares, context.world.size))
            return RestartInJob()
        """,
        limits={Level.RESTART: (5, 60.0)},
    )
    engine.decide(crash(), **facts())
    engine.decide(crash(), **facts(spares=0))
    seen = engine.user.hooks["on_crash"].__globals__["SEEN"]
    assert seen == [(0, 5, 1, 4), (1, 4, 0, 4)]


# --- fallbacks --------------------------------------------------------------------------------------


def test_a_hook_that_raises_falls_back_to_the_default_saying_why(tmp_path):
    engine = engine_for(tmp_path, "def on_crash(event, context):\n    raise RuntimeError('boom')\n")
    decision, _ = engine.decide(crash(), **facts())
    assert (decision.action, decision.source) == (RestartInJob(), DecisionSource.FALLBACK)
    assert decision.reason == "on_crash in policy.py raised RuntimeError: boom; the default policy decided"


def test_a_hook_that_runs_too_long_falls_back_without_holding_the_caller(tmp_path):
    engine = engine_for(
        tmp_path,
        """
        import threading
        RELEASE = threading.Event()
        def on_crash(event, context):
            RELEASE.wait(60)  # sleeps far beyond the limit
            return Fail(reason="too late")
        """,
        hook_timeout=0.2,
    )
    try:
        decision, _ = engine.decide(crash(), **facts())
    finally:
        engine.user.hooks["on_crash"].__globals__["RELEASE"].set()
    assert (decision.action, decision.source) == (RestartInJob(), DecisionSource.FALLBACK)
    assert decision.reason == "on_crash in policy.py exceeded its 0.2 s limit; the default policy decided"


@pytest.mark.parametrize(
    ("returns", "facts_changes", "why"),
    [
        ("'restart'", {}, "returned 'restart', but it is not an Action (a str; return e.g. RestartInJob())"),
        ("None", {}, "returned None, but it is not an Action (a NoneType"),
        (
            "Ignore()",
            {},
            "returned Ignore(), but a crash event does not allow 'ignore' "
            "(allowed: fail, replace, restart, scale_down, wait)",
        ),
        ("ReplaceHost(host=1)", {"spares": 0}, "returned ReplaceHost(host=1), but no spare is available"),
        (
            "ScaleDown(slices=(0, 1))",
            {},
            "returned ScaleDown(slices=(0, 1)), but that would leave 0 slice(s), below spec.minSlices=1",
        ),
        ("Wait(seconds=-1)", {}, "raised ValueError: Wait.seconds must be > 0, not -1"),
    ],
)
def test_an_invalid_or_infeasible_answer_falls_back_saying_what_was_wrong(
    tmp_path, returns, facts_changes, why
):
    engine = engine_for(tmp_path, f"def on_crash(event, context):\n    return {returns}\n")
    decision, _ = engine.decide(crash(), **facts(**facts_changes))
    assert decision.source == DecisionSource.FALLBACK
    assert decision.action == RestartInJob()
    assert decision.reason.startswith(f"on_crash in policy.py {why}")
    assert decision.reason.endswith("; the default policy decided")


def test_an_answer_whose_budget_is_spent_falls_back(tmp_path):
    engine = engine_for(
        tmp_path,
        "def on_crash(event, context):\n    return RestartInJob()\n",
        limits={Level.RESTART: (1, 60.0)},
    )
    first, _ = engine.decide(crash(), **facts())
    second, _ = engine.decide(crash(), **facts())
    assert (first.action, first.source) == (RestartInJob(), DecisionSource.USER)
    assert (second.action, second.source) == (ReplaceHost(host=1), DecisionSource.FALLBACK)
    assert (
        "but the restart budget is spent (1 of 1 within 60 s, spec.policy.budgets.restart)" in second.reason
    )


class _BrokenLadder(EscalationLadder):
    def on_crash(self, event, context):
        return Ignore()

    def on_hang(self, event, context):
        raise KeyError("oops")


def test_when_even_the_default_answer_is_invalid_the_job_fails_with_the_reason():
    engine = PolicyEngine(default=_BrokenLadder())
    decision, _ = engine.decide(crash(), **facts())
    assert isinstance(decision.action, Fail)
    assert decision.action.reason == (
        "no valid remedy for crash on host 1 (exit code 1): the default policy returned Ignore(), "
        "but a crash event does not allow 'ignore' (allowed: fail, replace, restart, scale_down, wait)"
    )
    hang = Hang(host=0, t=999.0, step=40, generation=1)
    assert "the default policy raised KeyError: 'oops'" in engine.decide(hang, **facts())[0].action.reason


# --- history and budgets ------------------------------------------------------------------------------


def test_evaluate_changes_nothing_and_decide_records_and_charges():
    engine = PolicyEngine()
    context = engine.context(**facts())
    engine.evaluate(crash(), context)
    assert engine.history == () and engine.ledger.budgets(1000.0)[Level.RESTART].used == 0
    decision, seen = engine.decide(crash(), **facts())
    assert seen == context  # the context the decision was made in: nothing recorded before it
    assert engine.history == (decision,)
    assert engine.context(**facts()).budgets[Level.RESTART].used == 1


def test_only_the_ladder_levels_spend_budget(tmp_path):
    engine = engine_for(
        tmp_path,
        """
        def on_host_lost(event, context):
            return Wait(seconds=5)
        def on_straggler(event, context):
            return Ignore()
        """,
    )
    engine.decide(HostLost(host=3, t=999.0, step=40, generation=1), **facts())
    engine.decide(Straggler(host=1, score=2.0, t=999.0, step=40, generation=1), **facts())
    assert len(engine.history) == 2
    assert all(b.used == 0 for b in engine.context(**facts()).budgets.values())


def test_a_budget_counts_only_uses_within_its_window():
    ledger = BudgetLedger({Level.REPLACE: (2, 100.0)})
    ledger.use(Level.REPLACE, 1000.0)
    ledger.use(Level.REPLACE, 1050.0)
    assert ledger.budgets(1060.0)[Level.REPLACE].left == 0
    assert ledger.budgets(1120.0)[Level.REPLACE].left == 1
    assert ledger.budgets(1200.0)[Level.REPLACE].left == 2
    assert ledger.budgets(1200.0)[Level.RESTART].limit == 10  # levels not given keep their defaults


def test_the_restart_budget_escalates_a_crash_loop_of_restarts():
    engine = PolicyEngine(limits={Level.RESTART: (2, 3600.0)})
    actions = [engine.decide(crash(host=h, t=999.0 + h), **facts(spares=0))[0].action for h in (0, 2, 0)]
    assert actions == [RestartInJob(), RestartInJob(), ScaleDown()]


# --- from the TrainingJob -----------------------------------------------------------------------------


def test_the_engine_follows_spec_policy(tmp_path):
    path = policy_file(tmp_path, "def on_crash(event, context):\n    return RestartInJob()\n")
    ref = api.PolicyRef.model_validate(
        {
            "file": str(path),
            "hookTimeoutSeconds": 0.5,
            "budgets": {"restart": {"max": 3, "windowSeconds": 600}, "scaleDown": {"max": 0}},
        }
    )
    engine = PolicyEngine.from_spec(ref)
    assert engine.user is not None and engine.user.path == path
    assert engine.hook_timeout == 0.5
    budgets = engine.context(**facts()).budgets
    assert (budgets[Level.RESTART].limit, budgets[Level.RESTART].window_seconds) == (3, 600.0)
    assert (budgets[Level.REPLACE].limit, budgets[Level.SCALE_DOWN].limit) == (4, 0)


def test_a_default_spec_policy_is_the_ladder_with_the_default_budgets():
    engine = PolicyEngine.from_spec(api.PolicyRef())
    assert engine.user is None and engine.hook_timeout == 2.0
    assert {lv: (b.limit, b.window_seconds) for lv, b in engine.context(**facts()).budgets.items()} == {
        Level.RESTART: (10, 3600.0),
        Level.REPLACE: (4, 3600.0),
        Level.SCALE_DOWN: (4, 3600.0),
    }


def test_a_config_map_without_a_file_is_for_the_operator():
    with pytest.raises(UserError, match=r"spec\.policy\.configMap 'my-policy' is read by the operator"):
        PolicyEngine.from_spec(api.PolicyRef(config_map="my-policy"))


# --- the example policies behave as they say ----------------------------------------------------------


def _example(name: str) -> PolicyEngine:
    return PolicyEngine(load_policy(next(p for p in EXAMPLES if p.name == name)))


def test_no_hot_swap_scales_down_on_a_lost_host_and_back_up_later():
    engine = _example("no_hot_swap.py")
    lost, _ = engine.decide(HostLost(host=3, t=999.0, step=40, generation=1), **facts(spares=1))
    assert (lost.action, lost.source) == (ScaleDown(), DecisionSource.USER)
    shrunk = World(
        active_slices=(0,),
        full_slices=2,
        min_slices=1,
        hosts_per_slice=2,
        devices_per_host=2,
        restorable_slices=1,
    )
    back, _ = engine.decide(
        CapacityReturned(spares=2, t=1010.0, step=80, generation=2), **facts(world=shrunk)
    )
    assert (back.action, back.source) == (ScaleUp(), DecisionSource.USER)
    slow, _ = engine.decide(Straggler(host=1, score=2.0, t=1020.0, step=90, generation=3), **facts(spares=2))
    assert slow.action == Ignore()


def test_patient_waits_for_a_spare_before_scaling_down():
    engine = _example("patient.py")
    lost = HostLost(host=3, t=1000.0, step=40, generation=1)
    assert engine.decide(lost, **facts(spares=0, now=1001.0))[0].action == Wait(seconds=10)
    # Offered again (with the time of then), still no spare: wait on, until two minutes have passed.
    again = HostLost(host=3, t=1011.0, step=40, generation=1)
    assert engine.decide(again, **facts(spares=0, now=1011.0))[0].action == Wait(seconds=10)
    assert engine.decide(again, **facts(spares=0, now=1130.0))[0].action == ScaleDown()
    # A spare in time is taken.
    later = HostLost(host=1, t=2000.0, step=90, generation=2)
    assert engine.decide(later, **facts(spares=0, now=2000.0))[0].action == Wait(seconds=10)
    assert engine.decide(later, **facts(spares=1, now=2010.0))[0].action == ReplaceHost(host=1)


def test_fail_fast_stops_at_the_third_fault_in_ten_minutes():
    engine = _example("fail_fast.py")
    actions = [engine.decide(crash(host=h, t=990.0 + h), **facts())[0].action for h in (0, 1, 2)]
    assert actions[:2] == [RestartInJob(), RestartInJob()]
    assert isinstance(actions[2], Fail) and actions[2].reason.startswith("3 faults within 600 s")


def test_the_complete_policy_in_the_docs_loads_and_forbids_hot_swap(tmp_path):
    text = (Path(__file__).parents[2] / "docs" / "policy.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "from_docs.py").write_text(code)
    engine = PolicyEngine(load_policy(tmp_path / "from_docs.py"))
    decision, _ = engine.decide(HostLost(host=3, t=999.0, step=40, generation=1), **facts(spares=1))
    assert (decision.action, decision.source) == (ScaleDown(), DecisionSource.USER)

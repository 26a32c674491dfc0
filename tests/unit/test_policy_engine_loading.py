"""The policy engine loading a user's file: a file that cannot work is refused before anything runs,
naming the file, the line and what is wrong; the example policies load."""

import pytest

from slicekeeper.errors import UserError
from slicekeeper.policy.engine import KNOWN_HOOKS, load_policy
from tests.support.policy_files import EXAMPLES, crash, policy_file

# --- loading: a file that cannot work is refused before anything runs ---------------------------------


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"nope\.py: cannot read the policy file: No such file"):
        load_policy(tmp_path / "nope.py")


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    path = policy_file(tmp_path, "def on_crash(event, context)\n    return RestartInJob()\n")
    with pytest.raises(UserError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}:2: syntax error in the policy:")


def test_an_exception_while_loading_names_the_line(tmp_path):
    path = policy_file(tmp_path, "LIMIT = 1 / 0\n")
    with pytest.raises(UserError) as caught:
        load_policy(path)
    assert (
        str(caught.value)
        == f"{path}:2: the policy raised ZeroDivisionError: division by zero while it was loaded"
    )


def test_a_file_without_hooks_is_refused_listing_the_hooks(tmp_path):
    path = policy_file(tmp_path, "def crash_handler(event, context):\n    return RestartInJob()\n")
    with pytest.raises(UserError) as caught:
        load_policy(path)
    assert f"{path}: defines no policy hook; define at least one of: " in str(caught.value)
    assert all(hook in str(caught.value) for hook in KNOWN_HOOKS)


def test_a_misspelt_hook_is_refused_with_a_suggestion(tmp_path):
    path = policy_file(tmp_path, "def on_crahs(event, context):\n    return RestartInJob()\n")
    with pytest.raises(UserError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert message.startswith(
        f"{path}:2: unknown hook 'on_crahs' (did you mean on_crash?); known hooks: on_crash,"
    )


@pytest.mark.parametrize(
    "signature",
    ["(event)", "(event, context, extra)", "(event, *, context)", "()"],
)
def test_a_hook_that_cannot_take_event_and_context_is_refused(tmp_path, signature):
    path = policy_file(tmp_path, f"def on_hang{signature}:\n    return RestartInJob()\n")
    with pytest.raises(UserError) as caught:
        load_policy(path)
    assert str(caught.value) == (
        f"{path}:2: hook 'on_hang{signature}' must take exactly two positional arguments: "
        "def on_hang(event, context)"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("on_crash = 3\n", "hook 'on_crash' must be a function, not int"),
        (
            "async def on_crash(event, context):\n    return RestartInJob()\n",
            "must be a plain function, not 'async def'",
        ),
        ("def on_crash(event, context):\n    yield RestartInJob()\n", "must return an Action, not yield"),
    ],
)
def test_a_hook_that_is_not_a_plain_function_is_refused(tmp_path, body, message):
    with pytest.raises(UserError, match=message):
        load_policy(policy_file(tmp_path, body))


def test_hooks_may_have_extra_optional_parameters_or_be_borrowed_from_the_ladder(tmp_path):
    loaded = load_policy(
        policy_file(
            tmp_path,
            """
            from slicekeeper.policy.default import EscalationLadder
            on_host_lost = EscalationLadder().on_host_lost
            on_straggler = lambda event, context: Ignore()
            def on_crash(event, context, verbose=False):
                return RestartInJob()
            def on_hang(*args):
                return RestartInJob()
            """,
        )
    )
    assert sorted(loaded.hooks) == ["on_crash", "on_hang", "on_host_lost", "on_straggler"]


def test_each_load_is_a_module_of_its_own(tmp_path):
    path = policy_file(
        tmp_path,
        "CALLS = []\ndef on_crash(event, context):\n    CALLS.append(1)\n    return RestartInJob()\n",
    )
    first, second = load_policy(path), load_policy(path)
    first.hooks["on_crash"](crash(), None)
    assert first.hooks["on_crash"].__globals__["CALLS"] == [1]
    assert second.hooks["on_crash"].__globals__["CALLS"] == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_example_policies_load(example):
    assert load_policy(example).hooks


def test_there_are_example_policies():
    assert {p.name for p in EXAMPLES} >= {"no_hot_swap.py", "patient.py"}

"""The no-recompilation check of the recovery tests (tests/support/recovery_checks.compiled_again):
a restart into a world that ran before must compile nothing, by the workload's ProgramCache lists
and by the framework's own compile events, and every restarted host of a workload that says what it
compiled must say it. Each finding is shown on a report made to have it (the negative controls)."""

from __future__ import annotations

from typing import Any

from tests.support.recovery_checks import compiled_again

SAID = {
    "loaded": ["gather", "local_grads", "apply"],
    "compiled": [],
    "backend_compiled": [],
    "backend_compiles": 0,
}


def report(*hosts: dict[str, Any], world: list[int] | None = None) -> dict[str, Any]:
    """A run of 2 hosts restarted once (generation 1), each restarted host's breakdown as given."""
    breakdown = {"hosts": [{"host": h, "generation": 1, **said} for h, said in enumerate(hosts)]}
    return {
        "hosts": [{"host": 0}, {"host": 1}],
        "recoveries": [{"generation": 1, "world": world if world is not None else [0, 1]}],
        "faults": [{"breakdown": breakdown}],
    }


def test_a_restart_that_loaded_every_program_passes():
    assert compiled_again(report(SAID, SAID)) == []


def test_a_workload_that_never_says_what_it_compiled_is_not_asked_to():
    assert compiled_again(report({}, {})) == []  # e.g. the SDK loop: no compiled programs at all


def test_programs_the_cache_compiled_again_are_found():
    found = compiled_again(report(SAID, {**SAID, "compiled": ["apply"], "loaded": ["gather"]}))
    assert found == ["generation 1: host 1 compiled ['apply'] again (world [0, 1] ran before)"]


def test_programs_compiled_behind_the_caches_back_are_found_by_the_frameworks_own_events():
    """The cache's lists say all was loaded, JAX's compile events say otherwise."""
    behind = {**SAID, "backend_compiled": ["jit(apply)"], "backend_compiles": 1}
    assert compiled_again(report(behind, SAID)) == [
        "generation 1: host 0's framework compiled 1 program(s) again (jit(apply))"
    ]


def test_a_host_that_never_says_what_it_compiled_fails_when_the_others_do():
    assert compiled_again(report(SAID, {})) == ["generation 1: host 1 never said what it compiled"]


def test_compiling_for_a_world_that_never_ran_is_expected():
    """After a scale-down the world is new: its programs are compiled, and that is no finding."""
    first = {**SAID, "compiled": ["apply"], "backend_compiled": ["jit(apply)"], "backend_compiles": 1}
    assert compiled_again(report(first, world=[0])) == []

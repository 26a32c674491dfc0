"""A host's reference is the median of its peers' medians, computed for a whole job at once.

The detector reads each host's reference off one sorted list per core (and one of every host) instead
of taking a median over every other host for each host, which cost the square of the job's size (at
5,000 hosts, seconds of the leader's event loop per step). These tests hold the fast way to the
definition: for any medians and any cores, each reference equals the median over the host's peers
taken one by one (the hosts sharing its core, when there are others, else every other host).
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slicekeeper.supervisor.signals import straggler
from slicekeeper.supervisor.signals.straggler import StragglerDetector, median_without

works = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


def by_definition(medians: dict[int, float], cores: dict[int, int]) -> dict[int, float]:
    """Each host's reference, peer by peer (the detector's definition, in the square of the hosts)."""
    references = {}
    for host in medians:
        others = [h for h in medians if h != host]
        mates = [h for h in others if host in cores and cores.get(h) == cores[host]]
        references[host] = statistics.median(medians[peer] for peer in mates or others)
    return references


@given(st.lists(works, min_size=2, max_size=40), st.data())
def test_a_median_without_one_value_is_the_median_of_the_rest(
    values: list[float], data: st.DataObject
) -> None:
    left_out = data.draw(st.sampled_from(values))
    rest = list(values)
    rest.remove(left_out)
    assert median_without(sorted(values), left_out) == statistics.median(rest)


@settings(max_examples=100)
@given(
    st.dictionaries(st.integers(0, 60), works, min_size=2, max_size=40),
    st.dictionaries(st.integers(0, 60), st.integers(0, 3), max_size=40),
)
def test_every_reference_is_the_median_of_the_hosts_peers(
    medians: dict[int, float], cores: dict[int, int]
) -> None:
    detector = StragglerDetector()
    detector.reset(medians)
    for host, core in cores.items():
        if host in medians:
            detector.observe(host, 1, 0.1, core=core)
    known = {host: core for host, core in cores.items() if host in medians}
    assert detector._references(medians) == by_definition(medians, known)


def test_negative_control_a_reference_that_counts_the_host_itself_fails_the_property(monkeypatch):
    """The property above, run against a mutant that takes the median over every host, the host's own
    included (with two hosts: half of a 2x slowdown), fails."""
    monkeypatch.setattr(straggler, "median_without", lambda ordered, value: statistics.median(ordered))
    with pytest.raises(AssertionError):
        test_every_reference_is_the_median_of_the_hosts_peers()


def test_a_step_of_a_25000_host_job_is_scored_with_a_straggler_found() -> None:
    """At the size the leader serves, a slow host is still found (the scoring no longer costs the
    square of the hosts; the control-plane benchmark measures the leader's time). It becomes slow after
    the first step, its baseline."""
    hosts = 25_000
    detector = StragglerDetector(window=1, persistence=2, warmup=0)
    detector.reset(range(hosts))
    found = []
    for step in range(1, 5):
        for host in range(hosts):
            slowdown = 3 if host == 777 and step > 1 else 1
            found += detector.observe(host, step, 0.1 * slowdown + host % 7 * 1e-4)
    assert [finding.host for finding in found] == [777]

"""The supervisors' Prometheus metrics, scraped from a `slicekeeper run` while it goes on.

What a user's dashboard and alerts read has to move when the events happen: steps and their times,
the restart generation, restarts by kind, checkpoints saved, copied, restored and failed by tier,
the hang allowance, goodput and badput by category. These tests drive the real supervisors (the SDK
example loop, chaos faults, checkpoint copies made to fail) and scrape every host's endpoint from
the first moment (`spec.local.metricsPort` fixes the ports) until the run ends, then hold the series
against the run's own record of what happened: the report and each host's event log.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.supervisor.ports import free_port_block

from tests.support.cli_runs import (
    documented_metrics,
    read_report,
    sdk_loop_fingerprint,
    sdk_loop_job,
    started_cli,
)

Labels = frozenset[tuple[str, str]]

HOSTS = 4
STARTUP_ALLOWANCE = 90.0
STEP_ALLOWANCE = 5.0
"""Hang allowances of the runs (startupTimeoutSeconds, hangTimeoutFloorSeconds): values no other
setting takes, so the gauge shows which one applies."""


@dataclass(frozen=True)
class Scrape:
    """One scrape of one host's endpoint, and when it was taken (time.time() before and after)."""

    host: int
    started: float
    ended: float
    samples: dict[tuple[str, Labels], float]

    def get(self, name: str, **labels: str) -> float:
        """A sample's value; 0 for a labelled counter child that does not exist yet."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def labelled(self, name: str) -> dict[Labels, float]:
        return {labels: value for (sample, labels), value in self.samples.items() if sample == name}


class Scraper:
    """Scrapes every host's endpoint in the background, as often as it can, keeping every scrape."""

    def __init__(self, ports: dict[int, int]) -> None:
        self.ports = ports
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for host, port in self.ports.items():
                started = time.time()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                        text = response.read().decode()
                except (OSError, http.client.HTTPException):
                    continue  # not up yet, or gone (mid-answer)
                samples = {
                    (sample.name, frozenset(sample.labels.items())): sample.value
                    for family in text_string_to_metric_families(text)
                    for sample in family.samples
                }
                if samples:  # an empty answer: the process ended while it answered
                    self.scrapes.append(Scrape(host, started, time.time(), samples))
            time.sleep(0.05)

    def of(self, host: int) -> list[Scrape]:
        return [s for s in self.scrapes if s.host == host]


@dataclass
class Run:
    where: Path
    report: dict[str, Any]
    scraper: Scraper
    run_dir: Path

    def events(self, host: int) -> list[dict[str, Any]]:
        """Host `host`'s event log (its original machine)."""
        lines = (self.run_dir / f"host-{host}" / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def last(self, host: int) -> Scrape:
        return self.scraper.of(host)[-1]

    def before_the_first_stop(self, host: int) -> list[Scrape]:
        """Host `host`'s scrapes taken before its supervisor was first told to stop its workload."""
        stops = [e["t"] for e in self.events(host) if e.get("source") == "leader" and e["type"] == "stop"]
        return [s for s in self.scraper.of(host) if s.ended < min(stops, default=float("inf"))]


def run_scraped(
    where: Path, chaos: str, steps: int, *, sabotage: Callable[[str], None] | None = None, **spec: Any
) -> Run:
    """Run the SDK loop job with `chaos`, scraping every host; `sabotage(run_name)` is called as soon
    as the CLI prints the run directory, seconds before the first checkpoint."""
    base = free_port_block(HOSTS)
    job = sdk_loop_job(
        where / "job.yaml",
        steps=steps,
        local={**spec.pop("local", {}), "metricsPort": base, "workDir": str(where / "runs")},
        health={"hangTimeoutFloorSeconds": STEP_ALLOWANCE, "startupTimeoutSeconds": STARTUP_ALLOWANCE},
        **spec,
    )
    report_path = where / "report.json"
    with (
        Scraper({host: base + host for host in range(HOSTS)}) as scraper,
        started_cli("run", str(job), "--report", str(report_path), "--chaos", chaos) as cli,
    ):
        assert cli.stdout is not None
        run_dir = None
        for line in cli.stdout:
            if "run directory:" in line and run_dir is None:
                run_dir = Path(line.split("run directory:")[1].split()[0])
                if sabotage is not None:
                    sabotage(run_dir.name)
        _, err = cli.communicate()
        assert cli.returncode == 0, err
    assert run_dir is not None
    report = read_report(report_path)
    assert report["params_fingerprint"] == sdk_loop_fingerprint(steps)
    for host in range(HOSTS):
        assert scraper.of(host), f"host {host}'s endpoint was never scraped"
    return Run(where, report, scraper, run_dir)


# --- a run with a crash and a hang, a failed local save and failed persistent uploads ---------------

STEPS = 60
BLOCKED_LOCAL = (3, 25)
"""Host 3's local save of step 25 fails: a file sits where its folder is written."""
BLOCKED_PERSISTENT = 50
"""Every host's persistent upload of step 50 fails: a file sits where the step's folder goes."""


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Host 1 killed at step 20 (restart from local copies); host 2 hung at step 40 while the others
    run to the end, so the restart after it goes back past what their local and peer tiers keep."""
    where = tmp_path_factory.mktemp("metrics")
    local_dir, persistent = where / "checkpoints", where / "persistent"

    def sabotage(run_name: str) -> None:
        host, step = BLOCKED_LOCAL
        local = local_dir / run_name / f"host-{host}" / "local"
        local.mkdir(parents=True, exist_ok=True)
        (local / f"step-{step:08d}.tmp").write_text("in the way")
        remote = persistent / "tiny-lm" / run_name
        remote.mkdir(parents=True, exist_ok=True)
        (remote / f"step-{BLOCKED_PERSISTENT:08d}").write_text("in the way")

    return run_scraped(
        where,
        "kill:host=1@step=20,hang:host=2@step=40",
        STEPS,
        sabotage=sabotage,
        checkpoint={
            "interval": 5,
            "localDir": str(local_dir),
            "persistent": {"uri": str(persistent), "interval": 10},
        },
    )


def test_the_metrics_exported_carry_the_documented_labels(faulty):
    documented = documented_metrics()
    seen: dict[str, set[str]] = {}
    for scrape in faulty.scraper.scrapes:
        for name, labels in scrape.samples:
            if name.endswith("_created"):
                continue
            family = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
            seen.setdefault(family if family in documented else name, set()).update(
                label for label, _ in labels if label != "le"
            )
    assert set(documented) <= set(seen)  # this run moves every one of them
    for name, labels in seen.items():
        assert name in documented, f"{name} is not in docs/supervisor.md"
        assert labels == documented[name].labels, name


def test_steps_are_counted_once_each_until_a_restart_then_replayed_ones_too(faulty):
    for host in range(HOSTS):
        scrapes = faulty.scraper.of(host)
        totals = [s.get("slicekeeper_steps_total") for s in scrapes]
        assert totals == sorted(totals) and totals[-1] > 0
        for scrape in scrapes:
            # step_duration is observed just before steps_total moves: a scrape may fall in between.
            durations = scrape.get("slicekeeper_step_duration_seconds_count")
            assert 0 <= durations - scrape.get("slicekeeper_steps_total") <= 1
            if scrape.get("slicekeeper_restart_generation") == 0 and not scrape.labelled(
                "slicekeeper_restarts_total"
            ):
                assert 0 <= scrape.get("slicekeeper_steps_total") - scrape.get("slicekeeper_step") <= 1
        last = faulty.last(host)
        assert last.get("slicekeeper_steps_total") > last.get("slicekeeper_step") + 1  # replayed steps
        assert max(s.get("slicekeeper_step") for s in scrapes) >= 40


def test_the_generation_follows_each_restart_on_every_host(faulty):
    assert faulty.report["restarts"] == {"crash": 1, "hang": 1}
    for host in range(HOSTS):
        generations = [s.get("slicekeeper_restart_generation") for s in faulty.scraper.of(host)]
        assert generations == sorted(generations)
        assert set(generations) == {0.0, 1.0, 2.0}


def test_restarts_are_counted_by_kind_on_every_host_crash_first(faulty):
    for host in range(HOSTS):
        scrapes = faulty.scraper.of(host)
        kinds = [
            {
                dict(labels)["kind"]: value
                for labels, value in s.labelled("slicekeeper_restarts_total").items()
            }
            for s in scrapes
        ]
        assert kinds[0] == {}
        assert {"crash": 1.0} in kinds
        assert kinds[-1] == {"crash": 1.0, "hang": 1.0}
        assert kinds[-1] == {k: float(v) for k, v in faulty.report["restarts"].items()}


def test_the_last_checkpoint_step_follows_the_saves_at_the_interval(faulty):
    for host in range(HOSTS):
        scrapes = faulty.scraper.of(host)
        first = [s for s in scrapes if s.get("slicekeeper_restart_generation") == 0]
        saved = [s.get("slicekeeper_last_checkpoint_step") for s in first]
        assert saved == sorted(saved)
        assert all(step % 5 == 0 for step in saved)
        assert all(s.get("slicekeeper_last_checkpoint_step") <= s.get("slicekeeper_step") for s in first)
        # It moves with the saves: seen at two of them at least over the run. Generation 0 alone
        # (steps 1-20 at 50 ms) is too short for that on a loaded machine: a scrape round of the four
        # hosts once took long enough that only step 15 of 5, 10 and 15 was seen (a whole run).
        seen = {s.get("slicekeeper_last_checkpoint_step") for s in scrapes}
        assert len(seen - {0.0}) >= 2, sorted(seen)


def test_after_a_restart_the_last_checkpoint_step_is_never_one_the_restart_discarded(faulty):
    """Until a generation saves again, the newest committed local step is at most its restore step
    (the steps after it were deleted from every tier when the generation started)."""
    checked = 0
    for host in range(HOSTS):
        events = faulty.events(host)
        starts = {e["generation"]: e["restore_step"] for e in events if e.get("type") == "start"}
        for generation, restore_step in starts.items():
            if restore_step is None:
                continue
            saves = [
                e["t"]
                for e in events
                if e.get("type") == "checkpoint_saved" and e.get("generation") == generation
            ]
            before_a_save = [
                s
                for s in faulty.scraper.of(host)
                if s.get("slicekeeper_restart_generation") == generation
                and s.ended < min(saves, default=1e18)
            ]
            for scrape in before_a_save:
                assert scrape.get("slicekeeper_last_checkpoint_step") <= restore_step, (
                    f"host {host}, generation {generation} restored step {restore_step}"
                )
            checked += len(before_a_save)
    assert checked > 0, "no scrape fell between a restart and the next save"


def test_restores_and_their_transfers_are_counted_by_the_tier_they_came_from(faulty):
    restores = faulty.report["restores"]
    assert {r["tier"] for r in restores} >= {"local", "persistent"}
    for host in range(HOSTS):
        last = faulty.last(host)
        for tier in ("local", "peer", "persistent"):
            expected = sum(1 for r in restores if r["host"] == host and r["tier"] == tier)
            assert last.get("slicekeeper_restores_total", tier=tier) == expected, (host, tier)
            transfers = last.get(
                "slicekeeper_checkpoint_transfer_seconds_count", tier=tier, direction="restore"
            )
            assert transfers == expected, (host, tier)


def test_copies_to_the_peer_and_persistent_tiers_are_timed(faulty):
    for host in range(HOSTS):
        events = faulty.events(host)
        last = faulty.last(host)
        for tier, logged in (("peer", "replicated"), ("persistent", "persisted")):
            copies = last.get("slicekeeper_checkpoint_transfer_seconds_count", tier=tier, direction="save")
            assert 0 < copies <= sum(1 for e in events if e.get("type") == logged), (host, tier)


def test_failed_saves_and_uploads_are_counted_by_tier_as_the_report_counts_them(faulty):
    failed = {
        tier: sum(
            faulty.last(host).get("slicekeeper_checkpoint_failures_total", tier=tier) for host in range(HOSTS)
        )
        for tier in ("local", "peer", "persistent")
    }
    reported = faulty.report["failed_saves"]
    assert failed == {tier: float(reported.get(tier, 0)) for tier in failed}
    blocked_host, _ = BLOCKED_LOCAL
    for host in range(HOSTS):
        local = faulty.last(host).get("slicekeeper_checkpoint_failures_total", tier="local")
        assert (local > 0) == (host == blocked_host), host
        assert faulty.last(host).get("slicekeeper_checkpoint_failures_total", tier="persistent") > 0


def test_the_hang_allowance_is_the_startup_one_until_the_first_step_then_the_step_one(faulty):
    for host in range(HOSTS):
        scrapes = faulty.scraper.of(host)
        before = {
            s.get("slicekeeper_hang_timeout_seconds")
            for s in scrapes
            if s.get("slicekeeper_steps_total") == 0
        } - {0.0}  # 0: read before the watchdog's first round
        assert before == {STARTUP_ALLOWANCE}, host
        training = [
            s.get("slicekeeper_hang_timeout_seconds") for s in scrapes if s.get("slicekeeper_steps_total") > 1
        ]
        assert STEP_ALLOWANCE in training, host


def test_goodput_and_badput_seconds_move_with_what_each_host_is_doing(faulty):
    def badput(scrape: Scrape, category: str) -> float:
        return scrape.get("slicekeeper_badput_seconds_total", category=category)

    for host in range(HOSTS):
        scrapes = faulty.scraper.of(host)
        before = faulty.before_the_first_stop(host)
        # Before the first restart: startup, then productive steps; nothing to recover from.
        assert all(badput(s, "infrastructure_recovery") == 0 for s in before)
        assert all(badput(s, "wasted_progress") == 0 for s in before)
        trained = [s for s in before if s.get("slicekeeper_steps_total") > 0]
        assert trained and badput(trained[0], "program_startup") > 0
        assert trained[-1].get("slicekeeper_productive_seconds_total") > 0
        last = scrapes[-1]
        for category in ("infrastructure_recovery", "wasted_progress", "checkpoint_restore"):
            assert badput(last, category) > 0, (host, category)
        assert 0 < last.get("slicekeeper_goodput_ratio") < 1
    # The hung host's silence, at least the hang allowance long, went to recovery, not to its open step.
    assert badput(faulty.last(2), "infrastructure_recovery") >= STEP_ALLOWANCE


def test_goodput_and_badput_counters_never_go_down(faulty):
    """A Prometheus counter that goes down reads as a reset: rate() and increase() jump by its value."""
    for host in range(HOSTS):
        scrapes = faulty.scraper.of(host)
        series = {"productive": [s.get("slicekeeper_productive_seconds_total") for s in scrapes]}
        for scrape in scrapes:
            for labels, value in scrape.labelled("slicekeeper_badput_seconds_total").items():
                series.setdefault(dict(labels)["category"], []).append(value)
        for category, values in series.items():
            drops = [(a, b) for a, b in itertools.pairwise(values) if b < a]
            assert drops == [], f"host {host}: {category} seconds went down"


# --- runs that change the hosts ------------------------------------------------------------------


def test_a_parked_host_shows_the_generation_it_is_parked_in(tmp_path_factory):
    """Host 3 lost with no spare: the job drops slice 1 and host 2 is parked until the end."""
    run = run_scraped(tmp_path_factory.mktemp("park"), "lose:host=3@step=15", 40)
    assert [w["hosts"] for w in run.report["world"]] == [4, 2]
    parked = run.last(2)
    assert parked.get("slicekeeper_badput_seconds_total", category="scaled_down") > 0
    assert parked.get("slicekeeper_restarts_total", kind="host_lost") == 1
    assert run.last(0).get("slicekeeper_restart_generation") == 1
    assert parked.get("slicekeeper_restart_generation") == 1


def test_every_spare_gets_a_metrics_port_of_its_own_and_can_take_over(tmp_path_factory):
    """Two hosts lost, two spares waiting: both are swapped in, with a metrics base port set. The
    second loss comes 3 s into training: a spare's supervisor starts with the hosts, and on this
    2-core machine the second had not registered 1 s in (step 20: a fresh clone's run scaled down
    instead, no spare being there yet)."""
    run = run_scraped(
        tmp_path_factory.mktemp("spares"),
        "lose:host=1@step=10,lose:host=3@step=60",
        80,
        local={"spares": 2},
    )
    assert run.report["hot_swaps"]["hosts"] == [1, 3]
    assert [w["hosts"] for w in run.report["world"]] == [4]  # no scale-down

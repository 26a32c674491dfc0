"""Failure models for the fleet simulator: rates per chip-day by category, and each category's effect.

A model lists categories, each with its rate per accelerator chip per day and what slicekeeper sees
of it (`Effect`): a crashed workload, a hang, a lost machine, a silently corrupt state, an announced
maintenance. A category can take a whole slice (`whole_slice`): on a multi-host TPU slice a host event
on one VM interrupts the whole slice (GKE, docs/operations.md). Rates are per chip, not per host, so
the same model serves any chips-per-host: Meta's figures are per GPU, and the hardware behind most
interruptions (the accelerator, its memory) scales with the chips.

Named models (docs/simulator.md gives the derivation):
- `llama3`: the Llama 3 paper's Table 5 (arXiv 2407.21783), 54 days on 16,384 GPUs: 419 unexpected
  interruptions by cause and 47 planned ones, divided by 16,384 x 54 GPU-days.
- `kokolis`: Meta's research clusters (Kokolis et al., arXiv 2410.21680): a mean time to failure of
  1.8 h at 16,384 GPUs, spread over the categories in Llama 3's proportions (the paper gives no split
  we could map one to one), no planned interruptions.
A model may also be read from a YAML file (`categories: [{name, per_chip_day, effect, whole_slice}]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import yaml

from slicekeeper.errors import UserError


class Effect(StrEnum):
    CRASH = "crash"
    """The workload exits (a software bug): an in-job restart can mend it."""
    HANG = "hang"
    """The collectives stall (a network switch or cable, a watchdog timeout)."""
    HOST_LOST = "host_lost"
    """The machine is gone (a faulty accelerator or its memory, a NIC, a power supply...)."""
    CORRUPT = "corrupt"
    """Silent data corruption: the state goes bad unseen; found at a non-finite loss, the newest
    checkpoint included, so an older one is restored."""
    MAINTENANCE = "maintenance"
    """A loss announced ahead (planned maintenance): saved for and handed over before it comes."""
    CAPACITY = "capacity"
    """Not a failure: a machine comes back (a replayed run's spare joining), for a dropped slice or
    the spare pool."""


@dataclass(frozen=True)
class Category:
    name: str
    per_chip_day: float
    effect: Effect
    whole_slice: bool = False


@dataclass(frozen=True)
class FailureModel:
    name: str
    source: str
    categories: tuple[Category, ...]

    @property
    def per_chip_day(self) -> float:
        return sum(c.per_chip_day for c in self.categories)


@dataclass(frozen=True)
class Failure:
    """One failure of the schedule: when (seconds from the start), which host, what."""

    t: float
    host: int
    category: Category
    step: int | None = None
    """A replayed run's fault came at a step (chaos `@step=S`): it comes when the job first reaches
    that step, whatever the time; `t` is then only the time it came in the real run."""


LLAMA3_GPU_DAYS = 16_384 * 54
LLAMA3_COUNTS: tuple[tuple[str, int, Effect, bool], ...] = (
    ("faulty GPU", 148, Effect.HOST_LOST, False),
    ("GPU HBM3 memory", 72, Effect.HOST_LOST, False),
    ("software bug", 54, Effect.CRASH, False),
    ("network switch/cable", 35, Effect.HANG, False),
    ("host maintenance", 32, Effect.HOST_LOST, True),  # unexpected: no notice, the slice goes
    ("GPU SRAM memory", 19, Effect.HOST_LOST, False),
    ("GPU system processor", 17, Effect.HOST_LOST, False),
    ("NIC", 7, Effect.HOST_LOST, False),
    ("collective-library watchdog timeout", 7, Effect.HANG, False),
    ("silent data corruption", 6, Effect.CORRUPT, False),
    ("GPU thermal interface and sensor", 6, Effect.HOST_LOST, False),
    ("SSD", 3, Effect.HOST_LOST, False),
    ("power supply", 3, Effect.HOST_LOST, False),
    ("server chassis", 2, Effect.HOST_LOST, False),
    ("IO expansion board", 2, Effect.HOST_LOST, False),
    ("dependency", 2, Effect.CRASH, False),
    ("CPU", 2, Effect.HOST_LOST, False),
    ("system memory", 2, Effect.HOST_LOST, False),
    ("planned interruption", 47, Effect.MAINTENANCE, True),
)
"""Llama 3, Table 5: cause, count over the run, what slicekeeper sees of it, whether the slice goes."""

LLAMA3 = FailureModel(
    "llama3",
    "Llama 3 (arXiv 2407.21783), Table 5: 419 unexpected and 47 planned interruptions "
    "in 54 days on 16,384 GPUs",
    tuple(
        Category(name, count / LLAMA3_GPU_DAYS, effect, slice_)
        for name, count, effect, slice_ in LLAMA3_COUNTS
    ),
)

KOKOLIS_MTTF_HOURS = 1.8
"""Kokolis et al. (arXiv 2410.21680): projected mean time to failure at 16,384 GPUs."""
_UNEXPECTED = [c for c in LLAMA3.categories if c.effect is not Effect.MAINTENANCE]
_UNEXPECTED_RATE = sum(c.per_chip_day for c in _UNEXPECTED)
KOKOLIS = FailureModel(
    "kokolis",
    "Kokolis et al. (arXiv 2410.21680): MTTF 1.8 h at 16,384 GPUs, "
    "split as Llama 3's unexpected interruptions",
    tuple(
        Category(
            c.name,
            c.per_chip_day / _UNEXPECTED_RATE * 24 / KOKOLIS_MTTF_HOURS / 16_384,
            c.effect,
            c.whole_slice,
        )
        for c in _UNEXPECTED
    ),
)

MODELS = {LLAMA3.name: LLAMA3, KOKOLIS.name: KOKOLIS}


def failure_model(name_or_file: str) -> FailureModel:
    """A named model, or one read from a YAML file; UserError naming the file and field otherwise."""
    if name_or_file in MODELS:
        return MODELS[name_or_file]
    path = Path(name_or_file)
    if not path.is_file():
        raise UserError(f"--failures: '{name_or_file}' is neither a model ({', '.join(MODELS)}) nor a file")
    try:
        data = yaml.safe_load(path.read_text())
        categories = tuple(
            Category(
                str(c["name"]),
                float(c["per_chip_day"]),
                Effect(c["effect"]),
                bool(c.get("whole_slice", False)),
            )
            for c in data["categories"]
        )
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise UserError(
            f"{path}: a failure model is `categories: [{{name, per_chip_day, effect, whole_slice}}]` with "
            f"effect one of {', '.join(e.value for e in Effect)}: {error!r}"
        ) from None
    if any(c.per_chip_day < 0 for c in categories):
        raise UserError(f"{path}: per_chip_day must not be negative")
    return FailureModel(str(data.get("name", path.stem)), str(data.get("source", path)), categories)


def schedule(model: FailureModel, *, chips: int, host_count: int, seconds: float, seed: int) -> list[Failure]:
    """The failures of a run of `seconds` on `host_count` hosts holding `chips` chips, at the model's rates
    (a Poisson process per category), each on a host drawn at random, in time order."""
    rng = np.random.default_rng(seed)
    days = seconds / 86_400
    failures: list[Failure] = []
    for category in model.categories:
        count = int(rng.poisson(category.per_chip_day * chips * days))
        times = rng.uniform(0.0, seconds, size=count)
        where = rng.integers(0, host_count, size=count)
        failures += [Failure(float(t), int(h), category) for t, h in zip(times, where, strict=True)]
    return sorted(failures, key=lambda f: f.t)

"""TPU slice geometry: how many hosts a slice has and how many chips each host carries.

The operator needs these numbers for node selectors and `google.com/tpu` limits, the local runtime
to scale a job down to processes. The table follows REFERENCES sec. 1 (GKE TPU conventions): v4 and
v5p names count TensorCores (two per chip), v5e and v6e names count chips.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum


class TpuGeneration(StrEnum):
    V4 = "v4"
    V5E = "v5e"
    V5P = "v5p"
    V6E = "v6e"


@dataclass(frozen=True)
class GenerationFacts:
    accelerator: str
    """The `cloud.google.com/gke-tpu-accelerator` node label value."""
    cores_per_chip: int
    """TensorCores per chip as counted in the type name (v4-16 has 8 chips)."""
    dimensions: int
    """2 for the 2D torus generations (v5e, v6e), 3 for the 3D ones (v4, v5p)."""
    chips_per_host_choices: tuple[int, ...]
    """Chips per VM: fixed 4 for v4/v5p; 1, 4 or 8 by machine type for v5e/v6e."""


GENERATIONS: dict[TpuGeneration, GenerationFacts] = {
    TpuGeneration.V4: GenerationFacts("tpu-v4-podslice", 2, 3, (4,)),
    TpuGeneration.V5E: GenerationFacts("tpu-v5-lite-podslice", 1, 2, (1, 4, 8)),
    TpuGeneration.V5P: GenerationFacts("tpu-v5p-slice", 2, 3, (4,)),
    TpuGeneration.V6E: GenerationFacts("tpu-v6e-slice", 1, 2, (1, 4, 8)),
}

_TYPE_ALIASES = {"v5litepod": TpuGeneration.V5E, "v5lite": TpuGeneration.V5E}
_TYPE_RE = re.compile(r"^(?P<gen>[a-z0-9]+)-(?P<count>[1-9][0-9]*)$")
_TOPOLOGY_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")


class TpuShapeError(ValueError):
    """A TPU type, accelerator or topology that does not describe a real slice."""


@dataclass(frozen=True)
class SliceShape:
    """The resolved geometry of one TPU slice."""

    generation: TpuGeneration
    accelerator: str
    topology: str
    chips: int
    chips_per_host: int

    @property
    def host_count(self) -> int:
        """Hosts (VMs) of the slice."""
        return self.chips // self.chips_per_host

    @property
    def type_name(self) -> str:
        return f"{self.generation}-{self.chips * GENERATIONS[self.generation].cores_per_chip}"


def parse_type(tpu_type: str) -> tuple[TpuGeneration, int]:
    """`v5p-16` -> (v5p, 8 chips). Raises TpuShapeError naming what is wrong."""
    match = _TYPE_RE.match(tpu_type.strip().lower())
    if not match:
        raise TpuShapeError(f"'{tpu_type}' is not a TPU type like 'v5p-16', 'v5e-8', 'v4-32' or 'v6e-16'")
    name = match["gen"]
    try:
        generation = _TYPE_ALIASES.get(name) or TpuGeneration(name)
    except ValueError:
        known = ", ".join(g.value for g in TpuGeneration)
        raise TpuShapeError(f"unknown TPU generation '{name}' in '{tpu_type}' (known: {known})") from None
    count = int(match["count"])
    cores = GENERATIONS[generation].cores_per_chip
    if count % cores:
        raise TpuShapeError(f"'{tpu_type}': {generation} type names count TensorCores, a multiple of {cores}")
    return generation, count // cores


def generation_for_accelerator(accelerator: str) -> TpuGeneration:
    for generation, facts in GENERATIONS.items():
        if facts.accelerator == accelerator:
            return generation
    known = ", ".join(f.accelerator for f in GENERATIONS.values())
    raise TpuShapeError(f"unknown TPU accelerator '{accelerator}' (known: {known})")


def topology_chips(topology: str) -> int:
    if not _TOPOLOGY_RE.match(topology):
        raise TpuShapeError(f"'{topology}' is not a topology like '2x2x2' or '4x4'")
    return math.prod(int(d) for d in topology.split("x"))


def default_topology(generation: TpuGeneration, chips: int) -> str:
    """The most compact power-of-two torus for `chips` chips (GKE's usual slice shapes)."""
    dims = GENERATIONS[generation].dimensions
    if chips & (chips - 1):
        raise TpuShapeError(f"{chips} chips is not a power of two; give spec.tpu.topology explicitly")
    sides = [1] * dims
    remaining = chips
    if dims == 3:
        # 3D slices grow in the plane first (2x2x1), then double the smallest side, the
        # highest axis among equals: 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...
        for axis in (0, 1):
            if remaining > 1:
                sides[axis] = 2
                remaining //= 2
    while remaining > 1:
        smallest = min(sides)
        axis = max(i for i, side in enumerate(sides) if side == smallest)
        sides[axis] *= 2
        remaining //= 2
    return "x".join(str(s) for s in sides)


def default_chips_per_host(generation: TpuGeneration, chips: int) -> int:
    choices = GENERATIONS[generation].chips_per_host_choices
    if len(choices) == 1:
        return choices[0]
    # v5e/v6e: single-host slices use the machine type that holds the whole slice (1t/4t/8t);
    # multi-host slices are built from 4-chip VMs.
    return chips if chips in choices else 4


def resolve(
    *,
    tpu_type: str | None = None,
    accelerator: str | None = None,
    topology: str | None = None,
    chips_per_host: int | None = None,
) -> SliceShape:
    """Resolve a slice from a type and/or accelerator+topology, checking that they agree."""
    generation: TpuGeneration | None = None
    chips: int | None = None
    if tpu_type is not None:
        generation, chips = parse_type(tpu_type)
    if accelerator is not None:
        by_accelerator = generation_for_accelerator(accelerator)
        if generation is not None and by_accelerator != generation:
            raise TpuShapeError(
                f"accelerator '{accelerator}' is {by_accelerator}, but type '{tpu_type}' is {generation}"
            )
        generation = by_accelerator
    if generation is None:
        raise TpuShapeError("give a TPU type (e.g. 'v5p-16') or an accelerator and a topology")
    if topology is not None:
        topo_chips = topology_chips(topology)
        dims = GENERATIONS[generation].dimensions
        if len(topology.split("x")) != dims:
            raise TpuShapeError(f"{generation} topologies have {dims} dimensions, '{topology}' does not")
        if chips is not None and topo_chips != chips:
            raise TpuShapeError(
                f"topology '{topology}' has {topo_chips} chips, but type '{tpu_type}' has {chips}"
            )
        chips = topo_chips
    elif chips is None:
        raise TpuShapeError(f"accelerator '{accelerator}' needs a topology (e.g. '2x2x2')")
    else:
        topology = default_topology(generation, chips)
    choices = GENERATIONS[generation].chips_per_host_choices
    per_host = chips_per_host if chips_per_host is not None else default_chips_per_host(generation, chips)
    if per_host not in choices:
        raise TpuShapeError(
            f"{generation} hosts carry {' or '.join(map(str, choices))} chips, not {per_host}"
        )
    if chips < per_host:
        per_host = chips  # a sub-host slice (v4 2x2x1 is one full host; v5e 1x1 one chip)
    if chips % per_host:
        raise TpuShapeError(f"{chips} chips do not split into hosts of {per_host} chips")
    if per_host == 8 and chips > 8:
        raise TpuShapeError("8-chip hosts only form single-host slices (2x4); multi-host slices use 4")
    return SliceShape(generation, GENERATIONS[generation].accelerator, topology, chips, per_host)

"""TPU type / accelerator / topology resolution against the GKE table (REFERENCES sec. 1)."""

import pytest

from slicekeeper import tpu


@pytest.mark.parametrize(
    ("tpu_type", "accelerator", "topology", "chips", "per_host", "hosts"),
    [
        ("v5p-8", "tpu-v5p-slice", "2x2x1", 4, 4, 1),
        ("v5p-16", "tpu-v5p-slice", "2x2x2", 8, 4, 2),
        ("v4-32", "tpu-v4-podslice", "2x2x4", 16, 4, 4),
        ("v4-128", "tpu-v4-podslice", "4x4x4", 64, 4, 16),
        ("v5e-1", "tpu-v5-lite-podslice", "1x1", 1, 1, 1),
        ("v5e-4", "tpu-v5-lite-podslice", "2x2", 4, 4, 1),
        ("v5e-8", "tpu-v5-lite-podslice", "2x4", 8, 8, 1),
        ("v5e-16", "tpu-v5-lite-podslice", "4x4", 16, 4, 4),
        ("v6e-256", "tpu-v6e-slice", "16x16", 256, 4, 64),
        ("v5litepod-16", "tpu-v5-lite-podslice", "4x4", 16, 4, 4),
    ],
)
def test_a_type_resolves_to_the_gke_shape(tpu_type, accelerator, topology, chips, per_host, hosts):
    shape = tpu.resolve(tpu_type=tpu_type)
    assert (shape.accelerator, shape.topology, shape.chips, shape.chips_per_host, shape.host_count) == (
        accelerator,
        topology,
        chips,
        per_host,
        hosts,
    )


def test_v4_and_v5p_names_count_tensorcores_not_chips():
    assert tpu.resolve(tpu_type="v5p-16").chips == 8
    assert tpu.resolve(tpu_type="v5p-16").type_name == "v5p-16"


def test_accelerator_and_topology_alone_resolve_the_generation():
    shape = tpu.resolve(accelerator="tpu-v6e-slice", topology="4x4")
    assert (shape.generation, shape.host_count, shape.type_name) == (tpu.TpuGeneration.V6E, 4, "v6e-16")


def test_v5e_chips_per_host_follows_the_machine_type():
    assert tpu.resolve(tpu_type="v5e-8", chips_per_host=4).host_count == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tpu_type": "v9x-8"}, "unknown TPU generation 'v9x'"),
        ({"tpu_type": "v5p-7"}, "multiple of 2"),
        ({"tpu_type": "v5p"}, "is not a TPU type"),
        ({"tpu_type": "v5p-16", "topology": "2x2x4"}, "has 16 chips, but type 'v5p-16' has 8"),
        ({"tpu_type": "v5e-16", "topology": "2x2x4"}, "2 dimensions"),
        ({"accelerator": "tpu-v5p-slice"}, "needs a topology"),
        ({"accelerator": "gpu-h100"}, "unknown TPU accelerator"),
        ({"tpu_type": "v5p-16", "accelerator": "tpu-v4-podslice"}, "is v4, but type 'v5p-16' is v5p"),
        ({"tpu_type": "v5e-16", "chips_per_host": 8}, "8-chip hosts only form single-host slices"),
        ({"tpu_type": "v5p-16", "chips_per_host": 8}, "carry 4 chips"),
        ({}, "give a TPU type"),
    ],
)
def test_an_impossible_shape_is_refused_with_the_reason(kwargs, message):
    with pytest.raises(tpu.TpuShapeError, match=message):
        tpu.resolve(**kwargs)

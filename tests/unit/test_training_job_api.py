"""The TrainingJob models: defaults, derived geometry, and errors that name the field."""

from pathlib import Path

import pytest
import yaml

from slicekeeper import api
from slicekeeper.api import cluster_layout, local_layout
from slicekeeper.errors import UserError

EXAMPLE = Path(__file__).parents[2] / "examples" / "trainingjob.yaml"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def errors_for(document: dict) -> str:
    with pytest.raises(UserError) as caught:
        api.parse_training_job(document, "job.yaml")
    return str(caught.value)


def test_the_example_is_a_valid_four_host_job():
    job = api.load_training_job(EXAMPLE)
    assert job.metadata.name == "tiny-lm"
    assert job.total_hosts == 4
    assert job.slice_shape.topology == "2x2x2"


def test_camel_case_on_the_wire_and_snake_case_in_python():
    job = api.load_training_job(EXAMPLE)
    assert job.spec.checkpoint.max_to_keep == 3
    dumped = api.dump_training_job(job)
    assert dumped["spec"]["checkpoint"]["maxToKeep"] == 3
    assert api.parse_training_job(dumped) == job


def test_a_minimal_job_gets_sane_defaults():
    job = api.parse_training_job(
        {
            "apiVersion": "slicekeeper.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "a"},
            "spec": {"tpu": {"type": "v5e-4"}},
        }
    )
    assert job.spec.slices == 1
    assert job.spec.workload.command == api.DEFAULT_COMMAND
    assert job.spec.health.hang_timeout_floor_seconds == 2.0


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["spec"].update(foo=1), "spec.foo: unknown field"),
        (
            lambda d: d["spec"]["workload"].update(steps="many"),
            "spec.workload.steps: Input should be a valid integer",
        ),
        (lambda d: d["spec"].update(slices=0), "spec.slices: Input should be greater than 0"),
        (
            lambda d: d["spec"]["workload"].update(steps=-5),
            "spec.workload.steps: Input should be greater than 0",
        ),
        (lambda d: d["spec"]["tpu"].update(type="v9-8"), "spec.tpu: unknown TPU generation 'v9'"),
        (lambda d: d["spec"]["tpu"].update(topology="4x4x4"), "spec.tpu: topology '4x4x4' has 64 chips"),
        (lambda d: d["spec"]["health"].update(maxRestarts=-1), "spec.health.maxRestarts"),
        (lambda d: d["metadata"].update(name="Bad_Name"), "metadata.name: must be a DNS label"),
        (lambda d: d.update(kind="Pod"), "kind: Input should be 'TrainingJob'"),
        (
            lambda d: d["spec"]["workload"]["env"].append({"value": "x"}),
            "spec.workload.env[0].name: Field required",
        ),
    ],
)
def test_bad_input_names_the_field_and_the_problem(mutate, expected):
    document = example()
    document["spec"]["workload"].setdefault("env", [])
    mutate(document)
    message = errors_for(document)
    assert message.startswith("job.yaml: invalid TrainingJob")
    assert expected in message


def test_every_problem_is_listed_at_once():
    document = example()
    document["spec"]["slices"] = 0
    document["spec"]["bogus"] = True
    message = errors_for(document)
    assert "spec.slices" in message and "spec.bogus" in message


def test_an_unreadable_or_malformed_file_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="cannot read the TrainingJob file"):
        api.load_training_job(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    with pytest.raises(UserError, match="not valid YAML"):
        api.load_training_job(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(UserError, match="the file is empty"):
        api.load_training_job(empty)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42")
    with pytest.raises(UserError, match="expected a TrainingJob mapping"):
        api.load_training_job(scalar)


def test_local_layout_keeps_slices_and_scales_hosts_down():
    job = api.load_training_job(EXAMPLE)
    layout = local_layout(job)
    assert (layout.shape.slices, layout.shape.hosts_per_slice, layout.shape.devices_per_host) == (2, 2, 2)
    assert layout.host(3) == layout.host(3).__class__(3, 1, 1)
    assert layout.slice_hostnames(1) == ["tiny-lm-s1-w0", "tiny-lm-s1-w1"]


def test_local_layout_defaults_to_at_most_four_hosts():
    document = example()
    document["spec"]["tpu"] = {"type": "v4-128"}  # 16 hosts per slice
    del document["spec"]["local"]["hosts"]
    layout = local_layout(api.parse_training_job(document))
    assert layout.shape.host_count == 4 and layout.shape.slices == 2


def test_local_hosts_that_do_not_split_over_slices_are_refused():
    document = example()
    document["spec"]["local"]["hosts"] = 3
    with pytest.raises(UserError, match=r"spec\.local\.hosts: 3 hosts do not split evenly over 2 slices"):
        local_layout(api.parse_training_job(document))


def test_cluster_layout_follows_the_tpu_table():
    layout = cluster_layout(api.load_training_job(EXAMPLE))
    assert (layout.shape.slices, layout.shape.hosts_per_slice, layout.shape.devices_per_host) == (2, 2, 4)


# --- checkpoint tiers and spares ------------------------------------------------------------------


def test_the_example_still_validates_and_round_trips_with_its_tier_settings():
    job = api.load_training_job(EXAMPLE)
    checkpoint = job.spec.checkpoint
    assert checkpoint.persistent is not None and checkpoint.peer.replicas > 0  # it shows every tier
    assert api.parse_training_job(api.dump_training_job(job)) == job


def test_a_job_without_tier_settings_gets_one_peer_replica_no_persistent_tier_and_no_spares():
    job = api.parse_training_job(
        {
            "apiVersion": "slicekeeper.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "a"},
            "spec": {"tpu": {"type": "v5e-4"}},
        }
    )
    assert job.spec.checkpoint.peer == api.PeerTierSpec(replicas=1, max_to_keep=2)
    assert job.spec.checkpoint.persistent is None
    assert job.spec.local.spares == 0


def test_peer_and_persistent_defaults():
    document = example()
    document["spec"]["checkpoint"]["interval"] = 10
    document["spec"]["checkpoint"]["persistent"] = {"uri": "gs://bucket/ckpt"}
    checkpoint = api.parse_training_job(document).spec.checkpoint
    assert (checkpoint.peer.replicas, checkpoint.peer.max_to_keep) == (1, 2)
    assert checkpoint.persistent == api.PersistentTierSpec(uri="gs://bucket/ckpt", interval=50, max_to_keep=2)


def test_the_tiers_and_spares_round_trip_in_camel_case():
    document = example()
    document["spec"]["checkpoint"]["interval"] = 10
    document["spec"]["checkpoint"]["peer"] = {"replicas": 2, "maxToKeep": 3}
    document["spec"]["checkpoint"]["persistent"] = {
        "uri": "/mnt/ckpt",
        "interval": 20,
        "maxToKeep": 4,
        "callTimeoutSeconds": 60.0,
        "attempts": 5,
    }
    document["spec"]["local"]["spares"] = 2
    job = api.parse_training_job(document)
    assert job.spec.checkpoint.peer.max_to_keep == 3
    assert job.spec.checkpoint.persistent is not None
    assert (job.spec.checkpoint.persistent.interval, job.spec.checkpoint.persistent.max_to_keep) == (20, 4)
    assert job.spec.local.spares == 2
    dumped = api.dump_training_job(job)
    assert dumped["spec"]["checkpoint"]["persistent"] == document["spec"]["checkpoint"]["persistent"]
    assert dumped["spec"]["checkpoint"]["peer"] == {"replicas": 2, "maxToKeep": 3}
    assert api.parse_training_job(dumped) == job


def test_the_peer_tier_may_be_turned_off():
    document = example()
    document["spec"]["checkpoint"]["peer"] = {"replicas": 0}
    assert api.parse_training_job(document).spec.checkpoint.peer.replicas == 0


def test_a_persistent_interval_that_is_not_a_multiple_of_the_local_interval_is_refused():
    document = example()
    document["spec"]["checkpoint"]["interval"] = 10
    document["spec"]["checkpoint"]["persistent"] = {"uri": "gs://bucket/ckpt", "interval": 25}
    message = errors_for(document)
    assert "spec.checkpoint: persistent.interval (25) must be a multiple of interval (10)" in message


def test_the_default_persistent_interval_is_checked_against_the_local_interval_too():
    document = example()
    document["spec"]["checkpoint"]["interval"] = 15
    document["spec"]["checkpoint"]["persistent"] = {"uri": "gs://bucket/ckpt"}
    assert "persistent.interval (50) must be a multiple of interval (15)" in errors_for(document)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["spec"]["local"].update(spares=-1),
            "spec.local.spares: Input should be greater than or equal to 0",
        ),
        (
            lambda d: d["spec"]["checkpoint"].update(peer={"replicas": -1}),
            "spec.checkpoint.peer.replicas: Input should be greater than or equal to 0",
        ),
        (
            lambda d: d["spec"]["checkpoint"].update(peer={"maxToKeep": 0}),
            "spec.checkpoint.peer.maxToKeep: Input should be greater than 0",
        ),
        (
            lambda d: d["spec"]["checkpoint"].update(persistent={"interval": 10}),
            "spec.checkpoint.persistent.uri: Field required",
        ),
        (
            lambda d: d["spec"]["checkpoint"].update(persistent={"uri": ""}),
            "spec.checkpoint.persistent.uri: String should have at least 1 character",
        ),
        (
            lambda d: d["spec"]["checkpoint"].update(persistent={"uri": "/x", "interval": 0}),
            "spec.checkpoint.persistent.interval: Input should be greater than 0",
        ),
        (
            lambda d: d["spec"]["checkpoint"].update(persistent={"uri": "/x", "bucket": "b"}),
            "spec.checkpoint.persistent.bucket: unknown field",
        ),
    ],
    ids=[
        "negative-spares",
        "negative-replicas",
        "peer-keeps-nothing",
        "persistent-without-uri",
        "persistent-empty-uri",
        "persistent-interval-0",
        "persistent-unknown-field",
    ],
)
def test_bad_tier_or_spare_settings_name_the_field(mutate, expected):
    document = example()
    mutate(document)
    assert expected in errors_for(document)


# --- remediation policy and elasticity ----------------------------------------------------------------


def test_policy_and_min_slices_defaults():
    job = api.load_training_job(EXAMPLE)
    assert job.spec.min_slices == 1
    policy = job.spec.policy
    assert (policy.name, policy.file, policy.hook_timeout_seconds) == ("default", None, 2.0)
    budgets = policy.budgets
    assert (budgets.restart.max, budgets.restart.window_seconds) == (10, 3600.0)
    assert (budgets.replace.max, budgets.replace.window_seconds) == (4, 3600.0)
    assert (budgets.scale_down.max, budgets.scale_down.window_seconds) == (4, 3600.0)


def test_policy_settings_round_trip_in_camel_case_and_a_partial_budget_keeps_its_level_default():
    document = example()
    document["spec"]["minSlices"] = 2
    document["spec"]["policy"] = {
        "file": "policies/mine.py",
        "hookTimeoutSeconds": 0.5,
        "budgets": {"restart": {"windowSeconds": 600}, "scaleDown": {"max": 0}},
    }
    job = api.parse_training_job(document)
    assert job.spec.min_slices == 2
    assert (job.spec.policy.budgets.restart.max, job.spec.policy.budgets.restart.window_seconds) == (
        10,
        600.0,
    )
    assert job.spec.policy.budgets.scale_down.max == 0
    dumped = api.dump_training_job(job)
    assert dumped["spec"]["minSlices"] == 2
    assert dumped["spec"]["policy"]["budgets"]["scaleDown"] == {"max": 0, "windowSeconds": 3600.0}
    assert dumped["spec"]["policy"]["hookTimeoutSeconds"] == 0.5
    assert api.parse_training_job(dumped) == job


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["spec"].update(minSlices=3), "spec: minSlices (3) must not exceed slices (2)"),
        (lambda d: d["spec"].update(minSlices=0), "spec.minSlices: Input should be greater than 0"),
        (
            lambda d: d["spec"].update(policy={"hookTimeoutSeconds": 0}),
            "spec.policy.hookTimeoutSeconds: Input should be greater than 0",
        ),
        (
            lambda d: d["spec"].update(policy={"budgets": {"replace": {"max": -1}}}),
            "spec.policy.budgets.replace.max: Input should be greater than or equal to 0",
        ),
        (
            lambda d: d["spec"].update(policy={"budgets": {"scaleDown": {"windowSeconds": 0}}}),
            "spec.policy.budgets.scaleDown.windowSeconds: Input should be greater than 0",
        ),
        (
            lambda d: d["spec"].update(policy={"budgets": {"hotSwap": {"max": 1}}}),
            "spec.policy.budgets.hotSwap: unknown field",
        ),
        (
            lambda d: d["spec"].update(policy={"file": "p.py", "configMap": "p"}),
            "spec.policy: give the policy one way, not file and configMap",
        ),
        (
            lambda d: d["spec"].update(kueue={"queueName": ""}),
            "spec.kueue.queueName: String should have at least 1 character",
        ),
    ],
    ids=[
        "min-above-slices",
        "min-zero",
        "timeout-zero",
        "negative-max",
        "window-zero",
        "unknown-level",
        "two-sources",
        "empty-queue",
    ],
)
def test_bad_policy_or_min_slices_settings_name_the_field(mutate, expected):
    document = example()
    mutate(document)
    assert expected in errors_for(document)


def test_the_torch_example_is_the_jax_example_with_the_torch_trainer():
    """examples/trainingjob-torch.yaml stays the JAX example's twin: only its name, its command, its
    persistent directory (two runs side by side must not share one) and its save interval (its steps
    are ~7 times shorter) differ."""
    torch_example = yaml.safe_load((EXAMPLE.parent / "trainingjob-torch.yaml").read_text())
    api.parse_training_job(torch_example, "examples/trainingjob-torch.yaml")
    assert torch_example["spec"]["workload"]["command"] == [
        "python",
        "-m",
        "slicekeeper.workload.reference.torch_trainer",
    ]
    jax_example = example()
    for document in (torch_example, jax_example):
        document["metadata"].pop("name")
        document["spec"]["workload"].pop("command")
        document["spec"]["checkpoint"]["persistent"].pop("uri")
        document["spec"]["checkpoint"].pop("interval")
    assert torch_example == jax_example

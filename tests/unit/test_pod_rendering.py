"""The manifests a TrainingJob becomes: GKE TPU conventions (REFERENCES sec. 1), valid Kubernetes objects,
and `slicekeeper render` printing them without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from slicekeeper.operator.cluster import VERSION
from slicekeeper.operator.render import (
    GROUP,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    manifests,
    render,
)

from slicekeeper import protocol
from slicekeeper.api import load_training_job, parse_training_job
from tests.support.cli_runs import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
KUBERNETES_VERSION = "1.31"
EXAMPLE_CHILDREN = ["Service", "ConfigMap", "NetworkPolicy", *["Pod"] * 4]
"""The example's children, in the order they are created: one pod per host of its two slices."""


def job(tpu: dict[str, Any], slices: int = 1, **spec: Any) -> Any:
    return parse_training_job(
        {
            "apiVersion": "slicekeeper.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "llm", "namespace": "research"},
            "spec": {"tpu": tpu, "slices": slices, **spec},
        }
    )


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def by_name(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods}


# --- what every pod carries ---------------------------------------------------------------------


def test_the_example_becomes_one_pod_per_tpu_host_with_the_gke_worker_environment():
    rendered = render(load_training_job(EXAMPLE))  # v5p-16: 8 chips, 4 per host; 2 slices
    pods = by_name(list(rendered.pods()))
    assert sorted(pods) == ["tiny-lm-s0-w0", "tiny-lm-s0-w1", "tiny-lm-s1-w0", "tiny-lm-s1-w1"]
    pod = pods["tiny-lm-s1-w1"]
    spec = pod["spec"]
    assert spec["hostname"] == "tiny-lm-s1-w1" and spec["subdomain"] == "tiny-lm"
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    container = spec["containers"][0]
    assert container["resources"]["limits"] == {"google.com/tpu": "4"}
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names))  # every variable once
    env = env_of(pod)
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_HOSTNAMES"] == "tiny-lm-s1-w0.tiny-lm,tiny-lm-s1-w1.tiny-lm"  # its own slice
    assert env["TPU_NAME"] == "tiny-lm-s1"
    assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_SLICE_ID"] == "1"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "tiny-lm-s0-w0.tiny-lm"
    assert env["MEGASCALE_PORT"] == "8080"
    assert env["SLICEKEEPER_HOST"] == "3"  # slice 1 x 2 hosts + worker 1: the JAX process id
    assert pod["metadata"]["labels"]["slicekeeper.dev/host"] == "3"


def test_the_supervisor_is_the_entrypoint_and_wraps_the_users_command():
    rendered = render(load_training_job(EXAMPLE))
    container = next(rendered.pods())["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "slicekeeper.supervisor"]
    assert container["command"][-1] == "--"
    assert container["args"] == ["python", "-m", "slicekeeper.workload.reference.jax_trainer", "--seed", "0"]
    downward = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e
    }
    assert downward == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_UID": "metadata.uid",
        "POD_IP": "status.podIP",  # where the supervisor listens and its peers reach it
        "NODE_NAME": "spec.nodeName",
    }
    # Why a supervisor failed the job (its last log lines) reaches the pod's termination message.
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


@pytest.mark.parametrize(
    ("tpu", "slices", "hosts_per_slice", "chips", "topology"),
    [
        ({"type": "v5e-16", "chipsPerHost": 4}, 1, 4, "4", "4x4"),
        ({"type": "v6e-8", "chipsPerHost": 8}, 2, 1, "8", "2x4"),
        ({"type": "v4-32"}, 3, 4, "4", "2x2x4"),
        ({"accelerator": "tpu-v5p-slice", "topology": "2x2x1"}, 1, 1, "4", "2x2x1"),
    ],
)
def test_hosts_chips_and_topology_follow_the_tpu_type(tpu, slices, hosts_per_slice, chips, topology):
    pods = list(render(job(tpu, slices)).pods())
    assert len(pods) == slices * hosts_per_slice
    for pod in pods:
        assert pod["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] == chips
        assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == topology
        hostnames = env_of(pod)["TPU_WORKER_HOSTNAMES"].split(",")
        assert len(hostnames) == hosts_per_slice
        assert f"{pod['metadata']['name']}.llm" in hostnames


def test_one_rendered_job_gives_each_pod_its_own_slice_s_worker_hostnames_in_any_order():
    # A rendered job keeps each slice's hostnames once worked out (a 25,000-host job's pods all come
    # from one): a pod of another slice, or one rendered out of order, still gets its own slice's.
    rendered = render(job({"type": "v4-32"}, 3))
    for index in (9, 0, 5, 11, 1, 4):
        hostnames = env_of(rendered.pod(rendered.layout.host(index)))["TPU_WORKER_HOSTNAMES"]
        assert hostnames == ",".join(f"llm-s{index // 4}-w{worker}.llm" for worker in range(4))


def test_every_pod_gets_the_termination_grace_the_spec_gives_its_supervisors():
    default = [pod["spec"]["terminationGracePeriodSeconds"] for pod in render(job({"type": "v5p-16"})).pods()]
    assert default == [30, 30]  # spec.disruption's default, on each host's pod
    longer = job({"type": "v5p-16"}, disruption={"terminationGracePeriodSeconds": 600})
    assert [pod["spec"]["terminationGracePeriodSeconds"] for pod in render(longer).pods()] == [600, 600]


def test_a_single_slice_job_gets_no_megascale_variables():
    env = env_of(next(render(job({"type": "v5p-16"})).pods()))
    assert not [name for name in env if name.startswith("MEGASCALE_")]


def test_a_slices_pods_share_a_node_pool_that_the_other_slices_keep_off():
    pods = list(render(job({"type": "v5p-16"}, slices=2)).pods())
    affinity = pods[2]["spec"]["affinity"]  # slice 1, worker 0
    together = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert together["topologyKey"] == "cloud.google.com/gke-nodepool"
    assert together["labelSelector"]["matchLabels"] == {
        "slicekeeper.dev/job": "llm",
        "slicekeeper.dev/slice": "1",
    }
    apart = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert apart["labelSelector"]["matchExpressions"] == [
        {"key": "slicekeeper.dev/slice", "operator": "NotIn", "values": ["1"]}
    ]


def test_kueue_gang_admission_labels_every_pod_with_the_group_and_its_size():
    pods = list(render(job({"type": "v5p-16"}, slices=2, kueue={"queueName": "tpu-queue"})).pods())
    for pod in pods:
        assert pod["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "tpu-queue"
        assert pod["metadata"]["labels"][KUEUE_GROUP_LABEL] == "llm"
        assert pod["metadata"]["annotations"][KUEUE_COUNT_ANNOTATION] == "4"
    assert "annotations" not in next(render(job({"type": "v5p-16"})).pods())["metadata"]


def test_the_users_environment_is_kept_but_cannot_override_the_workers_identity():
    rendered = render(
        job(
            {"type": "v5p-16"},
            workload={"env": [{"name": "TPU_WORKER_ID", "value": "7"}, {"name": "A", "value": "b"}]},
        )
    )
    env = env_of(next(rendered.pods()))
    assert env["TPU_WORKER_ID"] == "0" and env["A"] == "b"


def test_a_job_read_from_the_api_server_gives_its_pods_its_uid_for_the_lease_owner():
    read = parse_training_job(
        {
            "apiVersion": protocol.TRAININGJOB_API_VERSION,
            "kind": protocol.TRAININGJOB_KIND,
            "metadata": {"name": "llm", "namespace": "research", "uid": "0b1c-77"},
            "spec": {"tpu": {"type": "v5p-16"}},
        }
    )
    assert env_of(next(render(read).pods()))[protocol.ENV_JOB_UID] == "0b1c-77"
    assert protocol.ENV_JOB_UID not in env_of(next(render(job({"type": "v5p-16"})).pods()))  # a file's
    assert f"{GROUP}/{VERSION}" == protocol.TRAININGJOB_API_VERSION  # the kind the operator serves


# --- the other children -------------------------------------------------------------------------


def test_the_service_is_headless_and_publishes_pods_before_they_are_ready():
    service = render(load_training_job(EXAMPLE)).service()
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"slicekeeper.dev/job": "tiny-lm"}


def test_the_config_map_holds_the_job_and_the_policy_the_supervisors_read():
    source = "def on_crash(event, context):\n    return None\n"
    rendered = render(job({"type": "v5p-16"}), source)
    data = rendered.config_map()["data"]
    assert data["policy.py"] == source
    stored = parse_training_job(yaml.safe_load(data["trainingjob.yaml"]))
    assert stored.spec == rendered.job.spec
    pod = next(rendered.pods())
    assert {"name": "slicekeeper-config", "configMap": {"name": "llm-slicekeeper"}} in pod["spec"]["volumes"]


def test_a_users_policy_config_map_is_mounted_as_it_is():
    pod = next(render(job({"type": "v5p-16"}, policy={"configMap": "my-policy"})).pods())
    assert {"name": "policy", "configMap": {"name": "my-policy"}} in pod["spec"]["volumes"]
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["policy"] == "/etc/slicekeeper/user-policy"


def test_each_pod_keeps_its_compiled_programs_on_its_own_volume_or_on_the_jobs_shared_claim():
    own = next(render(job({"type": "v5p-16"})).pods())
    mounts = {m["name"]: m["mountPath"] for m in own["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["compilation-cache"] == protocol.COMPILATION_CACHE_DIR
    assert {"name": "compilation-cache", "emptyDir": {}} in own["spec"]["volumes"]
    shared = next(
        render(job({"type": "v5p-16"}, workload={"compilationCache": {"claimName": "programs"}})).pods()
    )
    claim = {"name": "compilation-cache", "persistentVolumeClaim": {"claimName": "programs"}}
    assert claim in shared["spec"]["volumes"]
    kubernetes_validate.validate(shared, KUBERNETES_VERSION, strict=True)


def test_a_subset_of_slices_renders_only_their_pods_and_keeps_their_identity():
    rendered = render(job({"type": "v5p-16"}, slices=3))
    names = [p["metadata"]["name"] for p in rendered.pods([0, 2])]
    assert names == ["llm-s0-w0", "llm-s0-w1", "llm-s2-w0", "llm-s2-w1"]
    with pytest.raises(ValueError, match="slice 3"):
        list(rendered.pods([3]))


@pytest.mark.parametrize("path", [EXAMPLE])
def test_every_manifest_is_a_valid_kubernetes_object(path: Path):
    documents = list(manifests(render(load_training_job(path), "def on_crash(e, c):\n    return None\n")))
    assert [d["kind"] for d in documents] == EXAMPLE_CHILDREN
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_large_job_is_rendered_one_pod_at_a_time():
    rendered = render(job({"type": "v5p-128"}, slices=200))  # 64 chips: 16 hosts per slice
    pods = rendered.pods()
    first = next(pods)
    assert first["metadata"]["name"] == "llm-s0-w0"
    assert sum(1 for _ in pods) == 200 * 16 - 1


# --- the command ---------------------------------------------------------------------------------


def test_render_prints_every_child_as_yaml(tmp_path):
    result = run_cli("render", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in documents] == EXAMPLE_CHILDREN
    sliced = list(yaml.safe_load_all(run_cli("render", str(EXAMPLE), "--slices", "1").stdout))
    assert [d["metadata"]["name"] for d in sliced if d["kind"] == "Pod"] == ["tiny-lm-s1-w0", "tiny-lm-s1-w1"]


def test_render_stores_a_policy_file_in_the_config_map_and_refuses_a_broken_one(tmp_path):
    policy = tmp_path / "policy.py"
    policy.write_text(
        "from slicekeeper.policy import Ignore\n\ndef on_straggler(event, context):\n    return Ignore()\n"
    )
    result = run_cli("render", str(EXAMPLE), "--policy", str(policy))
    assert result.returncode == 0, result.stderr
    config_map = next(d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "ConfigMap")
    assert config_map["data"]["policy.py"] == policy.read_text()
    assert "file" not in yaml.safe_load(config_map["data"]["trainingjob.yaml"])["spec"]["policy"]

    policy.write_text("def on_crash(event):\n    return None\n")  # a hook takes (event, context)
    broken = run_cli("render", str(EXAMPLE), "--policy", str(policy))
    assert broken.returncode == 2 and "on_crash" in broken.stderr and broken.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--slices", "5"], "--slices"), (["--slices", "a,b"], "--slices"), (["missing.yaml"], "missing.yaml")],
)
def test_render_refuses_bad_input_with_a_clear_error(args, message):
    argv = ["render", *args] if args[0] == "missing.yaml" else ["render", str(EXAMPLE), *args]
    result = run_cli(*argv)
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""

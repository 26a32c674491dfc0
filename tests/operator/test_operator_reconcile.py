"""The operator against an emulated API server: apply a TrainingJob and see its children; a bad spec
is marked Invalid; a failed, deleted or marked pod is hot-swapped away from its node; a job failed by
its supervisors stays failed; delete cleans up; an operator restart resumes."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import pytest
from kmock._internal import rendering
from slicekeeper.operator.cluster import USER_AGENT

from slicekeeper import credentials
from tests.support.cluster_emulator import Trouble
from tests.support.operator_example import NAMES, NS, example
from tests.support.operator_harness import Kube, emulated_cluster, eventually, operator
from tests.support.secrets import leaked_fragments

NETWORK_POLICIES = "networking.k8s.io/v1/networkpolicies"
pytestmark = pytest.mark.asyncio


async def test_a_training_job_becomes_its_service_config_map_and_one_pod_per_host(tmp_path):
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        pods = await eventually(lambda: len(kube.pods(NS)) == 4 and kube.pods(NS), what="4 pods")
        assert sorted(pods) == NAMES
        owner = kube.job(NS, "tiny-lm")
        for pod in pods.values():
            reference = pod["metadata"]["ownerReferences"][0]
            assert reference["uid"] == owner["metadata"]["uid"] and reference["kind"] == "TrainingJob"
        assert [s["metadata"]["name"] for s in kube.emulator.live("v1/services", NS)] == ["tiny-lm"]
        assert [c["metadata"]["name"] for c in kube.emulator.live("v1/configmaps", NS)] == [
            "tiny-lm-slicekeeper"
        ]
        [policy] = kube.emulator.live(NETWORK_POLICIES, NS)
        assert policy["metadata"]["name"] == "tiny-lm"
        assert policy["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        # The job's credentials: its own Secret, owned by it (the garbage collector deletes it with
        # the job), mounted into each of its pods; what it holds belongs together.
        [secret] = kube.emulator.live("v1/secrets", NS)
        assert secret["metadata"]["name"] == "tiny-lm-credentials" and secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        for pod in pods.values():
            [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
            assert volume["secret"]["secretName"] == "tiny-lm-credentials"
        files = {name: base64.b64decode(value) for name, value in secret["data"].items()}
        mounted = credentials.JobCredentials(files["ca.crt"], files["tls.crt"], files["tls.key"])
        mounted.write(tmp_path / "mounted")
        credentials.check(tmp_path / "mounted")
        written = {"events": kube.events(NS), "pods": pods, "job": kube.job(NS, "tiny-lm")}
        assert leaked_fragments(tmp_path / "mounted", {k: json.dumps(v) for k, v in written.items()}) == []
        status = await eventually(
            lambda: (
                kube.job(NS, "tiny-lm").get("status", {}).get("slicesTotal")
                and kube.job(NS, "tiny-lm")["status"]
            )
        )
        assert status["phase"] == "Pending" and status["observedGeneration"] == 1


async def test_a_status_written_before_the_operator_started_never_makes_a_job_invalid():
    """The status is the operator's (and the API server's defaults), never the user's input: an
    earlier operator's status, with what the schema keeps of it, is not validated as a spec."""
    async with emulated_cluster() as kube:
        await kube.apply(example())
        earlier = {"phase": "Running", "restarts": {"crash": 2}, "somethingNew": 1, "step": 7}
        await kube.patch_job_status(NS, "tiny-lm", earlier)
        async with operator(kube):
            await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
            status = kube.job(NS, "tiny-lm")["status"]
            assert status["phase"] != "Invalid" and "somethingNew" not in status


async def test_an_invalid_spec_is_marked_invalid_with_the_message_and_gets_no_pods():
    """A spec the CRD schema lets through (each field is valid) but the model refuses (minSlices
    above slices): the API server itself refuses what the schema forbids (slices: 0) with 422."""
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example(slices=1, minSlices=3))
        status = await eventually(
            lambda: (
                kube.job(NS, "tiny-lm").get("status", {}).get("phase") == "Invalid"
                and kube.job(NS, "tiny-lm")["status"]
            )
        )
        [condition] = status["conditions"]
        assert condition["type"] == "Invalid" and condition["status"] == "True"
        assert "minSlices (3) must not exceed slices (1)" in condition["message"]
        assert kube.pods(NS) == {}


async def test_a_failed_pod_is_replaced_with_the_same_identity_away_from_its_node():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        old_uid = kube.pods(NS)["tiny-lm-s1-w0"]["metadata"]["uid"]
        await eventually(lambda: [e for e in kube.events(NS) if e["reason"] == "Created"])  # posted async
        before = kube.writes()
        await kube.patch_pod(
            NS,
            "tiny-lm-s1-w0",
            {"spec": {"nodeName": "tpu-node-7"}, "status": {"phase": "Failed", "reason": "Evicted"}},
        )
        fresh = await eventually(
            lambda: (pod := kube.pods(NS).get("tiny-lm-s1-w0")) and pod["metadata"]["uid"] != old_uid and pod,
            what="a replacement pod",
        )
        await eventually(lambda: len([e for e in kube.events(NS) if e["reason"] == "HotSwap"]) == 1)
        # The hot-swap's writes to pods: our fault (the scheduler's bind and the kubelet's status, two
        # writes), the operator's delete and create; its plan on the job first, and one event.
        pod_writes = [w for w in kube.writes()[len(before) :] if w[0] == "pods"]
        assert sorted(pod_writes) == [
            ("pods", "CREATE"),
            ("pods", "DELETE"),
            ("pods", "UPDATE"),
            ("pods", "UPDATE"),
        ]
        hot_swap_events = [e["message"] for e in kube.events(NS) if e["reason"] == "HotSwap"]
        assert hot_swap_events == [
            "pod tiny-lm-s1-w0 replaced (it failed (Evicted)); avoiding nodes: tpu-node-7"
        ]
        terms = fresh["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert terms == [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["tpu-node-7"]}
                ]
            }
        ]
        assert fresh["metadata"]["annotations"]["slicekeeper.dev/hot-swaps"] == "1"
        env = {e["name"]: e.get("value") for e in fresh["spec"]["containers"][0]["env"]}
        assert env["TPU_WORKER_ID"] == "0" and env["SLICEKEEPER_HOST"] == "2"
        reasons = await eventually(lambda: [e["reason"] for e in kube.events(NS) if e["reason"] == "HotSwap"])
        assert reasons
        status = await eventually(
            lambda: (
                kube.job(NS, "tiny-lm").get("status", {}).get("restarts", {}).get("replace") == 1
                and kube.job(NS, "tiny-lm")["status"]
            )
        )
        assert status["restarts"]["replace"] == 1


async def test_a_pod_its_supervisor_marks_for_replacement_is_replaced():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        old_uid = kube.pods(NS)["tiny-lm-s0-w1"]["metadata"]["uid"]
        await kube.patch_pod(
            NS,
            "tiny-lm-s0-w1",
            {"metadata": {"annotations": {"slicekeeper.dev/replace": "straggler, score 1.9"}}},
        )
        await eventually(
            lambda: (pod := kube.pods(NS).get("tiny-lm-s0-w1")) and pod["metadata"]["uid"] != old_uid,
            what="a replacement",
        )


EXAMPLE_IMAGE = example()["spec"]["workload"]["image"]
NO_SLICEKEEPER = (
    "/usr/local/bin/python: Error while finding module specification for 'slicekeeper.supervisor' "
    "(ModuleNotFoundError: No module named 'slicekeeper')\n"
)
NO_PYTHON = 'exec: "python": executable file not found in $PATH: unknown'


@pytest.mark.parametrize(
    ("terminated", "said"),
    [
        ({"exitCode": 1, "message": "restart budget spent: 10 restarts"}, "restart budget spent"),
        # An image without slicekeeper or without python: replacing the pod would run it again.
        ({"exitCode": 1, "message": NO_SLICEKEEPER}, "does not carry slicekeeper"),
        ({"exitCode": 128, "reason": "StartError", "message": NO_PYTHON}, "no `python` on its PATH"),
    ],
    ids=["supervisor", "no-slicekeeper", "no-python"],
)
async def test_a_job_its_supervisors_failed_stays_failed_and_is_not_replaced(terminated, said):
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        old_uid = kube.pods(NS)["tiny-lm-s0-w0"]["metadata"]["uid"]
        await kube.patch_pod(
            NS,
            "tiny-lm-s0-w0",
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": "training",
                            "image": EXAMPLE_IMAGE,
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"terminated": terminated},
                        }
                    ],
                }
            },
        )
        status = await eventually(
            lambda: (
                kube.job(NS, "tiny-lm").get("status", {}).get("phase") == "Failed"
                and kube.job(NS, "tiny-lm")["status"]
            )
        )
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and said in failed["message"], failed["message"]
        assert kube.pods(NS)["tiny-lm-s0-w0"]["metadata"]["uid"] == old_uid


async def test_deleting_the_job_deletes_its_children():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        await kube.delete_job(NS, "tiny-lm")
        await eventually(
            lambda: (
                not kube.pods(NS)
                and not kube.emulator.live("v1/services", NS)
                and not kube.emulator.live(NETWORK_POLICIES, NS)
            ),
            what="no children",
        )
        await eventually(
            lambda: not kube.emulator.live("slicekeeper.dev/v1alpha1/trainingjobs", NS), what="the job gone"
        )


async def test_an_operator_restart_recreates_what_went_missing_while_it_was_down():
    async with emulated_cluster() as kube:
        async with operator(kube):
            await kube.apply(example())
            await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
            before = {name: pod["metadata"]["uid"] for name, pod in kube.pods(NS).items()}
        await kube.delete_pod(NS, "tiny-lm-s1-w1")
        assert len(kube.pods(NS)) == 3
        async with operator(kube) as cluster:
            await eventually(lambda: len(kube.pods(NS)) == 4, what="the pod back")
            after = {name: pod["metadata"]["uid"] for name, pod in kube.pods(NS).items()}
            assert {n: u for n, u in after.items() if n != "tiny-lm-s1-w1"} == {
                n: u for n, u in before.items() if n != "tiny-lm-s1-w1"
            }  # the others untouched
            assert after["tiny-lm-s1-w1"] != before["tiny-lm-s1-w1"]
            # Secret, Service, ConfigMap and NetworkPolicy (already there: 409) and the one pod,
            # which the status timer may also try to create while the resume handler does (a
            # second 409): never one per pod.
            assert cluster.writes <= 6


def the_operators_listing_of_the_pods(request: rendering.Request) -> bool:
    """The operator's listing of the jobs' pods (its informer's; not its watch)."""
    agent = str(request.headers.get("User-Agent", ""))
    watch = request.params.get("watch") in ("true", "1")
    return agent.startswith(USER_AGENT) and request.url.path == "/api/v1/pods" and not watch


async def test_a_pod_failed_while_the_operator_was_down_is_replaced_once_from_its_listing():
    """The restarted operator's pod listing (held back 3 s by the emulator here, as a 25,000-pod
    listing takes its time) finds the failed pod and replaces it; the job's resume handler waits
    for that listing, so it creates nothing itself (not even a create answered 409)."""
    async with emulated_cluster() as kube:
        async with operator(kube):
            await kube.apply(example())
            await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        victim = NAMES[2]
        old = kube.pods(NS)[victim]["metadata"]["uid"]
        await kube.patch_pod(
            NS,
            victim,
            {"spec": {"nodeName": "tpu-node-7"}, "status": {"phase": "Failed", "reason": "Evicted"}},
        )
        held = Trouble(until=time.monotonic() + 60, latency=(3.0, 3.0), throttled=0, failed=0)
        held.affects = the_operators_listing_of_the_pods
        kube.emulator.trouble = held
        before = len(kube.writes())
        async with operator(kube):
            fresh = await eventually(
                lambda: (pod := kube.pods(NS).get(victim)) and pod["metadata"]["uid"] != old and pod,
                what="the replacement",
            )
            assert len(held.requests) == 1  # (the listing held back: one page)
            assert fresh["metadata"]["annotations"]["slicekeeper.dev/avoid-nodes"] == "tpu-node-7"
            await eventually(
                lambda: kube.job(NS, "tiny-lm").get("status", {}).get("replacing") in (None, {}),
                what="the plan settled",
            )
            writes = [w for w in kube.writes()[before:] if w[0] in ("pods", "events")]
            assert sorted(writes) == [("events", "CREATE"), ("pods", "CREATE"), ("pods", "DELETE")]
            assert [e["reason"] for e in kube.events(NS)].count("HotSwap") == 1


async def bind_slices_to_nodes(kube: Kube) -> dict[str, str]:
    """Play the scheduler: slice 0 on node tpu-a, slice 1 on node tpu-b, all Running; the pods' uids."""
    for name in NAMES:
        node = "tpu-a" if "-s0-" in name else "tpu-b"
        await kube.patch_pod(NS, name, {"spec": {"nodeName": node}, "status": {"phase": "Running"}})
    return {n: p["metadata"]["uid"] for n, p in kube.pods(NS).items()}


async def lose_node_b(kube: Kube) -> None:
    await kube.put_node(
        {"metadata": {"name": "tpu-b"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )


async def only_slice_1_replaced(kube: Kube, uids: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Wait until slice 1's pods are new ones; slice 0's must be the same. The pods then."""
    await eventually(
        lambda: all(
            (p := kube.pods(NS).get(n)) and p["metadata"]["uid"] != uids[n] for n in NAMES if "-s1-" in n
        ),
        what="slice 1's pods replaced",
    )
    pods = kube.pods(NS)
    assert sorted(pods) == NAMES
    assert all(pods[n]["metadata"]["uid"] == uids[n] for n in NAMES if "-s0-" in n)  # slice 0 untouched
    return pods


async def test_an_operator_restart_replaces_the_pods_of_a_node_lost_while_it_was_down():
    async with emulated_cluster() as kube:
        async with operator(kube):
            await kube.apply(example())
            await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
            uids = await bind_slices_to_nodes(kube)
        await lose_node_b(kube)
        async with operator(kube):
            await only_slice_1_replaced(kube, uids)


async def test_a_node_going_not_ready_has_its_job_pods_replaced_elsewhere():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        uids = await bind_slices_to_nodes(kube)
        await lose_node_b(kube)
        pods = await only_slice_1_replaced(kube, uids)
        for name in ("tiny-lm-s1-w0", "tiny-lm-s1-w1"):
            expressions = pods[name]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert expressions["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["tpu-b"]


async def test_a_job_at_rest_costs_no_writes():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        for name in NAMES:
            await kube.patch_pod(NS, name, {"status": {"phase": "Running"}})
        await eventually(lambda: kube.job(NS, "tiny-lm")["status"].get("phase") == "Running", what="Running")
        await asyncio.sleep(1.0)  # the status written for the last change
        before = len(kube.writes())
        await asyncio.sleep(2.5)  # five timer runs with nothing changed
        assert kube.writes()[before:] == []


async def test_a_suspended_job_has_no_pods_until_it_resumes():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": True}})
        await eventually(
            lambda: not kube.pods(NS) and kube.job(NS, "tiny-lm")["status"].get("phase") == "Suspended",
            what="no pods, phase Suspended",
        )
        await asyncio.sleep(1.5)  # three timer runs: nothing is re-created while suspended
        assert kube.pods(NS) == {}
        assert [s["metadata"]["name"] for s in kube.emulator.live("v1/services", NS)] == ["tiny-lm"]
        await kube.patch_job(NS, "tiny-lm", {"spec": {"suspend": False}})
        await eventually(lambda: sorted(kube.pods(NS)) == NAMES, what="the 4 pods back")

        # kopf posts events from a queue of its own, after the handler that made the pods returned.
        def reasons() -> list[str]:
            return [event["reason"] for event in kube.events(NS)]

        await eventually(lambda: "Resumed" in reasons(), what="the Resumed event")
        assert "Suspended" in reasons()
        assert "HotSwap" not in reasons()  # pods deleted by a suspension are not failures


async def test_the_leaders_view_on_its_pod_becomes_the_job_status_and_scaling_events():
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        for name in NAMES:
            await kube.patch_pod(NS, name, {"status": {"phase": "Running"}})

        async def leader_publishes(**view: Any) -> None:
            text = json.dumps({"state": "running", "restarts": {"crash": 1}, **view})
            await kube.patch_pod(
                NS, "tiny-lm-s0-w0", {"metadata": {"annotations": {"slicekeeper.dev/status": text}}}
            )

        restore = {"generation": 1, "cause": "crash", "step": 30, "stepsReplayed": 4}
        await leader_publishes(
            step=40, slicesActive=2, lastCheckpointStep=35, lastRestore=restore, goodput=0.9
        )
        status = await eventually(  # (no status at all until the operator's first write)
            lambda: (
                (kube.job(NS, "tiny-lm").get("status") or {}).get("step") == 40
                and kube.job(NS, "tiny-lm")["status"]
            )
        )
        assert (status["phase"], status["slicesReady"], status["slicesActive"]) == ("Running", 2, 2)
        assert status["restarts"] == {"crash": 1, "replace": 0}
        assert (status["lastCheckpointStep"], status["goodput"]) == (35, 0.9)
        assert status["lastRestore"] == restore  # kept by the CRD's schema, not pruned
        # Host 3's replacement never joined: the leader's policy dropped slice 1.
        await kube.patch_pod(
            NS,
            "tiny-lm-s1-w1",
            {
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/8 nodes are available",
                        }
                    ],
                }
            },
        )
        await leader_publishes(step=60, slicesActive=1, lastCheckpointStep=55, goodput=0.8)

        def scaled_down() -> dict[str, Any] | None:
            status = kube.job(NS, "tiny-lm")["status"]
            conditions = {c["type"]: c for c in status.get("conditions", [])}
            return conditions.get("ScaledDown", {}).get("status") == "True" and conditions["ScaledDown"]

        down = await eventually(scaled_down, what="condition ScaledDown")
        assert "tiny-lm-s1-w1: 0/8 nodes are available" in down["message"]
        assert kube.job(NS, "tiny-lm")["status"]["phase"] == "Running"  # on the one slice left
        await leader_publishes(step=90, slicesActive=2)
        await eventually(lambda: "ScaleUp" in [e["reason"] for e in kube.events(NS)], what="ScaleUp event")
        assert [e["reason"] for e in kube.events(NS)].count("ScaleDown") == 1


async def test_a_job_that_succeeded_leaves_no_pod_that_never_ran_and_makes_none_again():
    """A replacement still Pending when the job succeeds is deleted, and stays deleted: its deletion
    is no lost pod to replace (the job is over), though the job's new phase may reach the operator's
    pod informers after the pod's DELETED event does."""
    async with emulated_cluster() as kube, operator(kube):
        await kube.apply(example())
        await eventually(lambda: len(kube.pods(NS)) == 4, what="4 pods")
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        for name in NAMES:
            if name == "tiny-lm-s1-w1":  # host 3's replacement never found a node
                status: dict[str, Any] = {"phase": "Pending"}
            else:
                status = {"phase": "Succeeded", "containerStatuses": [{"name": "training", "state": done}]}
            await kube.patch_pod(NS, name, {"status": status})
        view = json.dumps({"state": "succeeded", "step": 60, "slicesActive": 1})
        await kube.patch_pod(
            NS, "tiny-lm-s0-w0", {"metadata": {"annotations": {"slicekeeper.dev/status": view}}}
        )
        await eventually(
            lambda: kube.job(NS, "tiny-lm")["status"].get("phase") == "Succeeded", what="Succeeded"
        )
        await eventually(lambda: "tiny-lm-s1-w1" not in kube.pods(NS), what="the Pending pod deleted")
        await asyncio.sleep(3.0)  # six of the operator's looks at the job
        assert sorted(kube.pods(NS)) == sorted(set(NAMES) - {"tiny-lm-s1-w1"})
        assert "HotSwap" not in [e["reason"] for e in kube.events(NS)]

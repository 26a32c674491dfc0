"""The RBAC the operator and the supervisors run with (as the chart renders it): valid objects, and no
more than they need."""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes_validate
from slicekeeper.operator.render import manifests, render

from slicekeeper.api import load_training_job
from tests.support import chart
from tests.support.cli_runs import ROOT

SUPERVISOR = "slicekeeper-supervisor"
PLURALS = {
    "Service": ("", "services"),
    "ConfigMap": ("", "configmaps"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
    "Pod": ("", "pods"),
}


def documents(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return chart.rendered(values)["slicekeeper/templates/rbac.yaml"]


def rules_of(kind: str, name: str) -> list[dict[str, Any]]:
    return next(d["rules"] for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


def bindings_of(name: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [d for d in documents(values) if d["kind"] == "RoleBinding" and d["metadata"]["name"] == name]


def allows(rules: list[dict[str, Any]], resource: str, verb: str, group: str = "") -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_every_rbac_object_is_valid():
    kinds = [d["kind"] for d in chart.objects()]
    assert kinds.count("ServiceAccount") == 2 and "ClusterRole" in kinds and "Role" in kinds
    for document in documents():
        kubernetes_validate.validate(document, "1.31", strict=True)


def test_the_supervisor_may_only_read_watch_and_mark_pods_and_hold_its_jobs_lease():
    rules = rules_of("Role", "slicekeeper-supervisor")
    granted = {
        (group, resource, verb)
        for r in rules
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }
    assert granted == {
        ("", "pods", "get"),
        # a watch of its own pod (fieldSelector metadata.name), for the operator's notice: list + watch
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "pods/status", "get"),
        ("", "pods/status", "patch"),
        # leader election (supervisor/leader/election.py): read, create, renew; never delete or list
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }


def test_the_pods_run_as_the_supervisors_service_account():
    pod = next(render(load_training_job(ROOT / "examples" / "trainingjob.yaml")).pods())
    binding = bindings_of(SUPERVISOR)[0]
    assert binding["subjects"][0]["name"] == pod["spec"]["serviceAccountName"]


def test_the_operator_may_create_and_delete_every_child_it_renders_and_never_reads_a_secret():
    """It creates each job's credentials Secret and nothing more: no get, list, watch (which would
    read every Secret of a namespace), no patch or delete (the garbage collector deletes the Secret
    with its job)."""
    rules = rules_of("ClusterRole", "slicekeeper-operator")
    children = {
        d["kind"] for d in manifests(render(load_training_job(ROOT / "examples" / "trainingjob.yaml")))
    }
    for kind in children:
        group, plural = PLURALS[kind]
        assert allows(rules, plural, "create", group) and allows(rules, plural, "delete", group), kind
    assert allows(rules, "trainingjobs/status", "patch", "slicekeeper.dev")
    assert not allows(rules, "nodes", "patch") and not allows(rules, "nodes", "delete")
    assert not any("*" in r["resources"] or "*" in r["verbs"] for r in rules)
    assert allows(rules, "secrets", "create")
    for verb in ("get", "list", "watch", "patch", "update", "delete", "deletecollection"):
        assert not allows(rules, "secrets", verb), verb


def test_the_operator_may_block_its_jobs_deletion_on_the_children_it_adopts():
    """kopf.adopt gives every child an owner reference with blockOwnerDeletion; where the API server
    runs the OwnerReferencesPermissionEnforcement admission plugin (most distributions), creating
    such a child needs `update` on the owner's `finalizers` subresource."""
    example = load_training_job(ROOT / "examples" / "trainingjob.yaml")
    owner = kopf.Body(
        {
            "apiVersion": "slicekeeper.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "tiny-lm", "namespace": "research", "uid": "6b8c"},
        }
    )
    rules = rules_of("ClusterRole", "slicekeeper-operator")
    for child in manifests(render(example)):
        kopf.adopt(child, owner=owner, strict=False)
        for reference in child["metadata"]["ownerReferences"]:
            if reference.get("blockOwnerDeletion"):
                group = reference["apiVersion"].split("/")[0]
                assert allows(rules, "trainingjobs/finalizers", "update", group), child["kind"]


def test_the_operators_replicas_may_take_and_renew_their_lease_and_nothing_else_in_its_namespace():
    """Leader election among operator replicas (operator/leader_election.py): the Lease
    slicekeeper-operator read and renewed by name, created once; no other lease, no delete."""
    rules = rules_of("Role", "slicekeeper-operator")
    assert allows(rules, "leases", "create", "coordination.k8s.io")
    for verb in ("get", "update"):
        assert allows(rules, "leases", verb, "coordination.k8s.io")
        assert all(r.get("resourceNames") == ["slicekeeper-operator"] for r in rules if verb in r["verbs"])
    for verb in ("list", "watch", "patch", "delete"):
        assert not allows(rules, "leases", verb, "coordination.k8s.io"), verb
    assert {r["resources"][0] for r in rules} == {"leases"}


def test_every_namespace_that_runs_jobs_gets_the_supervisors_account_role_and_binding():
    values = {"supervisors": {"namespaces": ["research", "prod"], "serviceAccountName": "trainer"}}
    found = {
        (d["kind"], d["metadata"]["namespace"]) for d in documents(values) if "namespace" in d["metadata"]
    }
    for namespace in ("research", "prod"):
        assert {("ServiceAccount", namespace), ("Role", namespace), ("RoleBinding", namespace)} <= found
    assert ("Role", "default") not in found
    operator = [d for d in documents(values) if d["kind"] == "Role" and d["metadata"]["name"] != SUPERVISOR]
    assert [d["metadata"]["name"] for d in operator] == ["slicekeeper-operator"]  # its Lease (test above)
    bindings = bindings_of(SUPERVISOR, values)
    assert {b["subjects"][0]["name"] for b in bindings} == {"trainer"}

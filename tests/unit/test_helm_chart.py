"""The Helm chart as `helm lint` and `helm install` see it: linted and rendered by the Helm engine
(helm-python-sdk) for the default values and a matrix of others, every object valid against the
Kubernetes schema, each value landing where it should, and bad values refused by values.schema.json
with a message that names them."""

from __future__ import annotations

import tomllib
from typing import Any

import helm_python
import pytest
import yaml
from slicekeeper.operator.render import PORTS

from tests.support import chart
from tests.support.cli_runs import ROOT

KUBERNETES = "1.31"

MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "two-watched-namespaces": {"operator": {"watchNamespaces": ["research", "prod"], "logLevel": "debug"}},
    "stopped": {"operator": {"replicas": 0}},
    "placed": {
        "operator": {
            "nodeSelector": {"pool": "system"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]
                    }
                }
            },
            "podLabels": {"team": "ml-platform"},
            "podAnnotations": {"example.com/owner": "ml-platform"},
        }
    },
    "private-image": {
        "image": {"repository": "registry.example.com/sk", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry"}],
        "operator": {
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "livenessPort": 9808,
        },
    },
    "monitoring-off": {
        "monitoring": {
            "supervisors": {"enabled": False},
            "operator": {"enabled": False},
            "rules": {"enabled": False},
            "dashboards": {"enabled": False},
        }
    },
    "monitoring-tuned": {
        "monitoring": {
            "labels": {"release": "kube-prometheus-stack"},
            "supervisors": {"interval": "5s"},
            "rules": {"goodputObjective": 0.95, "goodputWindow": "6h", "noProgressMinutes": 3},
            "dashboards": {"namespace": "grafana", "folder": "Training"},
        }
    },
    "two-replicas": {"operator": {"replicas": 2, "leaderElection": {"leaseSeconds": 10}}},
    "no-leader-election": {"operator": {"leaderElection": {"enabled": False}}},
    "flow-schema": {"operator": {"api": {"flowSchema": {"enabled": True, "concurrencyShares": 50}}}},
    "supervisors-elsewhere": {
        "supervisors": {
            "namespaces": ["team-a", "team-b"],
            "serviceAccountName": "trainer",
            "admissionPolicy": False,
        }
    },
}


def _container(values: dict[str, Any]) -> dict[str, Any]:
    (container,) = chart.the("Deployment", values=values)["spec"]["template"]["spec"]["containers"]
    return container


def test_the_chart_is_the_release_of_the_package_it_installs():
    metadata = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert metadata["version"] == metadata["appVersion"] == version


@pytest.mark.parametrize("values", MATRIX.values(), ids=MATRIX.keys())
def test_helm_lint_finds_nothing_to_warn_about(values):
    report = helm_python.lint(chart.CHART, values, strict=True, kube_version=f"v{KUBERNETES}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # warnings and errors


@pytest.mark.parametrize("values", MATRIX.values(), ids=MATRIX.keys())
def test_every_rendered_object_is_valid_against_its_schema(values):
    """Kubernetes' kinds against the Kubernetes schema, the Prometheus Operator's against its CRDs."""
    assert chart.invalid(chart.objects(values), KUBERNETES) == {}


def test_the_schema_checks_catch_a_wrong_object():
    """The control: an interval Prometheus cannot read, a Deployment field that does not exist."""
    objects = chart.objects()
    monitor = next(o for o in objects if o["kind"] == "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["spec"]["replica"] = 1
    assert set(chart.invalid([monitor, deployment], KUBERNETES)) == {
        ("PodMonitor", "slicekeeper-supervisors"),
        ("Deployment", "slicekeeper-operator"),
    }


def test_the_values_reach_the_operator_deployment():
    args = _container(MATRIX["two-watched-namespaces"])["args"]
    assert {"--namespace=research", "--namespace=prod", "--log-level=debug"} <= set(args)
    assert not [a for a in _container({})["args"] if a.startswith("--namespace")]  # cluster-wide
    assert chart.the("Deployment", values=MATRIX["stopped"])["spec"]["replicas"] == 0
    placed = chart.the("Deployment", values=MATRIX["placed"])["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity"):
        assert placed["spec"][key] == MATRIX["placed"]["operator"][key]
    assert placed["metadata"]["labels"]["team"] == "ml-platform"
    assert placed["metadata"]["annotations"] == {"example.com/owner": "ml-platform"}
    private = MATRIX["private-image"]
    container = _container(private)
    assert container["image"] == "registry.example.com/sk:1.2.3" and container["imagePullPolicy"] == "Always"
    assert container["env"][1:] == private["operator"]["extraEnv"]  # after the replica's POD_NAME
    assert "--liveness=http://0.0.0.0:9808/healthz" in container["args"]
    assert {"name": "healthz", "containerPort": 9808} in container["ports"]
    pod = chart.the("Deployment", values=private)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]


def test_replicas_elect_the_one_that_acts_and_keep_one_through_a_drain():
    def pdbs(values: dict[str, Any]) -> list[chart.Manifest]:
        return [o for o in chart.objects(values) if o["kind"] == "PodDisruptionBudget"]

    two = MATRIX["two-replicas"]
    args = _container(two)["args"]
    assert "--leader-election" in args and "--leader-election-lease-seconds=10" in args
    assert f"--leader-election-namespace={chart.NAMESPACE}" in args
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in _container(two)[
        "env"
    ]
    deployment = chart.the("Deployment", values=two)["spec"]
    assert deployment["replicas"] == 2 and deployment["strategy"]["type"] == "RollingUpdate"
    [pdb] = pdbs(two)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["selector"]["matchLabels"]
    role = chart.the("Role", "slicekeeper-operator", values=two)
    assert {tuple(r["verbs"]) for r in role["rules"]} == {("get", "update"), ("create",)}
    assert not pdbs({})  # one replica: a budget of one would block every drain
    alone = MATRIX["no-leader-election"]
    assert not [a for a in _container(alone)["args"] if a.startswith("--leader-election")]
    assert chart.the("Deployment", values=alone)["spec"]["strategy"] == {"type": "Recreate"}
    assert not [
        o
        for o in chart.objects(alone)
        if o["kind"] == "Role" and o["metadata"]["name"] == "slicekeeper-operator"
    ]


def test_the_operator_gets_a_priority_level_of_its_own_only_when_asked():
    assert not [o for o in chart.objects() if o["apiVersion"].startswith("flowcontrol.")]
    objects = chart.objects(MATRIX["flow-schema"])
    level = next(o for o in objects if o["kind"] == "PriorityLevelConfiguration")
    schema = next(o for o in objects if o["kind"] == "FlowSchema")
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    deployment = chart.the("Deployment")["spec"]["template"]["spec"]
    assert deployment["serviceAccountName"] == account["metadata"]["name"]
    [rule] = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {
            "kind": "ServiceAccount",
            "serviceAccount": {"name": account["metadata"]["name"], "namespace": chart.NAMESPACE},
        }
    ]
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == level["metadata"]["name"]
    assert level["spec"]["limited"]["nominalConcurrencyShares"] == 50
    assert level["spec"]["limited"]["limitResponse"]["type"] == "Queue"
    assert schema["spec"]["matchingPrecedence"] < 9000  # before the built-in service-accounts schema


def test_the_supervisors_namespaces_get_their_role_and_the_policy_can_be_left_out():
    objects = chart.objects(MATRIX["supervisors-elsewhere"])
    roles = {
        (o["kind"], o["metadata"].get("namespace"))
        for o in objects
        if o["kind"] == "Role" and o["metadata"]["name"] == "slicekeeper-supervisor"
    }
    assert roles == {("Role", "team-a"), ("Role", "team-b")}
    assert not [o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": -1}}, "at '/operator/replicas': minimum: got -1, want 0"),
        ({"operator": {"replicas": 4}}, "at '/operator/replicas': maximum: got 4, want 3"),
        (
            {"operator": {"replicas": 2, "leaderElection": {"enabled": False}}},
            "at '/operator/leaderElection/enabled': value must be true",
        ),
        ({"operator": {"replica": 1}}, "at '/operator': additional properties 'replica' not allowed"),
        ({"imageTag": "1.0"}, "additional properties 'imageTag' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        (
            {"supervisors": {"namespaces": ["Team_A"]}},
            "at '/supervisors/namespaces/0': 'Team_A' does not match",
        ),
        ({"operator": {"logLevel": 3}}, "at '/operator/logLevel'"),
        (
            {"operator": {"api": {"flowSchema": {"lendablePercent": 101}}}},
            "at '/operator/api/flowSchema/lendablePercent': maximum: got 101, want 100",
        ),
    ],
    ids=[
        "negative-replicas",
        "four-replicas",
        "two-replicas-without-election",
        "unknown-key",
        "unknown-top-key",
        "pull-policy",
        "namespace",
        "type",
        "lendable-percent",
    ],
)
def test_bad_values_are_refused_with_the_schemas_message(values, message):
    loaded = helm_python.Chart.load(chart.CHART)
    try:
        with pytest.raises(helm_python.HelmValuesError, match=message.replace("[", r"\[")) as refused:
            loaded.render(values, name=chart.RELEASE, namespace=chart.NAMESPACE, is_install=True)
    finally:
        loaded.close()
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert [e for e in helm_python.lint(chart.CHART, values)["errors"] if message in e]  # `helm lint` too


def test_the_monitoring_pieces_follow_their_values():
    kinds = {o["kind"] for o in chart.objects(MATRIX["monitoring-off"])}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ConfigMap"}
    tuned = chart.objects(MATRIX["monitoring-tuned"])
    for kind in ("PodMonitor", "PrometheusRule"):
        assert all(
            o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in tuned if o["kind"] == kind
        )
    monitor = next(o for o in tuned if o["kind"] == "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "5s"
    rules = {
        r.get("alert"): r
        for g in next(o for o in tuned if o["kind"] == "PrometheusRule")["spec"]["groups"]
        for r in g["rules"]
    }
    assert "[6h]) < 0.95" in rules["SlicekeeperGoodputLow"]["expr"]
    assert "[3m]" in rules["SlicekeeperNoProgress"]["expr"]
    dashboards = [o for o in tuned if o["kind"] == "ConfigMap"]
    assert len(dashboards) == len(list((chart.CHART / "dashboards").glob("*.json"))) == 4
    assert all(d["metadata"]["namespace"] == "grafana" for d in dashboards)
    assert all(d["metadata"]["annotations"] == {"grafana_folder": "Training"} for d in dashboards)
    assert all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in dashboards)


def test_each_pod_monitor_scrapes_a_port_its_pods_name():
    """The operator's PodMonitor selects the operator's pod and a port it names; the supervisors'
    asks for the port the operator renders on every TPU pod."""
    objects = chart.objects({"operator": {"metricsPort": 9100}})
    monitors = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PodMonitor"}
    operator_pod = chart.the("Deployment", values={"operator": {"metricsPort": 9100}})["spec"]["template"]
    selector = monitors["slicekeeper-operator"]["selector"]["matchLabels"]
    assert selector.items() <= operator_pod["metadata"]["labels"].items()
    (container,) = operator_pod["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9100} in container["ports"]
    assert "--metrics-port=9100" in container["args"]
    [endpoint] = monitors["slicekeeper-operator"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert monitors["slicekeeper-supervisors"]["podMetricsEndpoints"][0]["port"] in PORTS

"""The operator's Deployment (as the chart renders it) and the image it runs: valid objects that agree
with the code and the RBAC.

A wrong probe path, a service account the chart does not define, or an image that misses a package
folder only shows on a real cluster, long after the change; these checks run offline.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any
from urllib.parse import urlsplit

from packaging.specifiers import SpecifierSet
from slicekeeper.operator.main import LIVENESS
from slicekeeper.operator.metrics import METRICS_PORT
from slicekeeper.operator.render import render

from slicekeeper import cli
from slicekeeper.api import load_training_job
from tests.support import chart
from tests.support.cli_runs import EXAMPLE, ROOT

DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def deployment(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return chart.the("Deployment", values=values)


def container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (found,) = deployment(values)["spec"]["template"]["spec"]["containers"]
    return found


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_every_object_is_valid_against_its_schema():
    assert chart.invalid(chart.objects()) == {}


def test_never_two_operators_acting_at_once():
    """By default one replica, elected on the operator's Lease before it acts: a rolling update's new
    pod stands by until the old one's Lease runs out. Without the election: one replica, Recreate."""
    spec = deployment()["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert "--leader-election" in container()["args"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    alone = deployment({"operator": {"leaderElection": {"enabled": False}}})["spec"]
    assert alone["strategy"] == {"type": "Recreate"}


def test_the_liveness_probe_asks_where_kopf_serves_it():
    box = container()
    (liveness,) = [arg.split("=", 1)[1] for arg in box["args"] if arg.startswith("--liveness=")]
    served = urlsplit(liveness)
    probe = box["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in box["ports"]}
    assert (probe["path"], ports[probe["port"]]) == (served.path, served.port)
    assert served.port == urlsplit(LIVENESS).port  # the chart's default is the command's
    assert box["command"] == ["slicekeeper", "operator"]
    assert "slicekeeper" in PYPROJECT["project"]["scripts"]


def test_the_port_named_metrics_is_where_the_operator_serves_its_metrics_by_default():
    """A PodMonitor scrapes the port by its name; `slicekeeper operator` serves there by default."""
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert ports["metrics"] == METRICS_PORT != ports["healthz"]
    assert cli.parser().parse_args(["operator"]).metrics_port == METRICS_PORT


def test_it_runs_as_the_operator_account_that_rbac_yaml_defines_and_binds():
    metadata, pod = deployment()["metadata"], deployment()["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    rbac = chart.objects()
    assert any(
        d["kind"] == "ServiceAccount"
        and d["metadata"]["name"] == account
        and d["metadata"]["namespace"] == metadata["namespace"] == "slicekeeper-system"
        for d in rbac
    )
    binding = next(d for d in rbac if d["kind"] == "ClusterRoleBinding")
    subject = {"kind": "ServiceAccount", "name": account, "namespace": metadata["namespace"]}
    assert subject in binding["subjects"]


def test_it_runs_non_root_on_a_read_only_root_with_bounded_resources():
    pod, box = deployment()["spec"]["template"]["spec"], container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert isinstance(pod["securityContext"]["runAsUser"], int) and pod["securityContext"]["runAsUser"] > 0
    assert box["securityContext"]["readOnlyRootFilesystem"] is True
    assert box["securityContext"]["allowPrivilegeEscalation"] is False
    assert box["securityContext"]["capabilities"]["drop"] == ["ALL"]
    resources = box["resources"]
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= resources[bound].keys(), bound
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    # One image for both, the operator's tagged with the release it comes with.
    repository, tag = box["image"].rsplit(":", 1)
    assert repository == load_training_job(EXAMPLE).spec.workload.image.rsplit(":", 1)[0]
    assert tag == PYPROJECT["project"]["version"]


def test_the_image_installs_existing_extras_and_runs_as_the_deployments_user():
    instructions = dockerfile_instructions()
    bases = [arguments.split()[0] for name, arguments in instructions if name == "FROM"]
    assert bases and all(base == "python:3.12-slim" for base in bases)
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains("3.12")
    (extras,) = [a.split("=", 1)[1] for n, a in instructions if n == "ARG" and a.startswith("EXTRAS=")]
    assert extras.split(",") == ["jax", "operator"]
    assert set(extras.split(",")) <= PYPROJECT["project"]["optional-dependencies"].keys()
    (user,) = [arguments for name, arguments in instructions if name == "USER"]
    uid = deployment()["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert user.split(":")[0] == str(uid), "runAsNonRoot needs the image's numeric user"
    assert not [name for name, _ in instructions if name in ("ENTRYPOINT", "CMD")]


def test_the_image_copies_every_package_folder_and_the_build_context_keeps_them():
    folders = {"slicekeeper", *PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    top_level = {folder.split("/")[0] for folder in folders}
    copied = {
        source.rstrip("/")
        for name, arguments in dockerfile_instructions()
        if name == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    }
    assert top_level | {"pyproject.toml", "README.md"} <= copied
    kept = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert copied <= kept, f"the build context leaves out {copied - kept}"


def test_the_pods_command_is_a_module_the_image_installs():
    pod = next(render(load_training_job(EXAMPLE)).pods())
    command = pod["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "slicekeeper.supervisor"]
    assert command[2] in PYPROJECT["tool"]["setuptools"]["packages"]


def test_every_argument_the_chart_gives_the_operator_is_one_its_command_takes():
    """The chart's command line, for the default values and for values that add arguments, as
    `slicekeeper operator` parses it: a flag the code renamed or dropped fails here, not in a pod."""
    values = {"operator": {"watchNamespaces": ["a", "b"], "logLevel": "debug", "livenessPort": 9808}}
    for given in ({}, values):
        command = container(given)["command"]
        assert command[:2] == ["slicekeeper", "operator"]
        parsed = cli.parser().parse_args([*command[1:], *container(given)["args"]])
    assert parsed.handler.__name__ == "_operator"
    assert (parsed.namespace, parsed.log_level) == (["a", "b"], "debug")
    assert parsed.liveness == "http://0.0.0.0:9808/healthz"

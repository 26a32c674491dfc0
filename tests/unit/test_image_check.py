"""An image that cannot run slicekeeper's supervisor is told from a host that failed, by how its
container ended (operator/image_check.py); anything else is not blamed on the image."""

from __future__ import annotations

from typing import Any

import pytest
from slicekeeper.operator.image_check import unusable_image

IMAGE = "registry.example/team/trainer:v3"


def ended(**terminated: Any) -> dict[str, Any]:
    return {
        "spec": {"containers": [{"name": "training", "image": IMAGE}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "training", "state": {"terminated": terminated}}],
        },
    }


@pytest.mark.parametrize(
    "message",
    [
        "/usr/local/bin/python: No module named slicekeeper.supervisor\n",
        "/usr/bin/python3: Error while finding module specification for 'slicekeeper.supervisor' "
        "(ModuleNotFoundError: No module named 'slicekeeper')\n",
    ],
)
def test_python_without_slicekeeper_is_the_image_named_with_how_to_fix_it(message):
    said = unusable_image(ended(exitCode=1, message=message))
    assert said is not None and IMAGE in said and "does not carry slicekeeper" in said
    assert "pip install slicekeeper" in said


def test_an_image_without_python_is_the_image_whether_the_runtime_ends_or_holds_the_container():
    containerd = 'failed to create containerd task: exec: "python": executable file not found in $PATH'
    said = unusable_image(ended(exitCode=128, reason="StartError", message=containerd))
    assert said is not None and IMAGE in said and "no `python` on its PATH" in said
    crio = "container create failed: executable file `python` not found in $PATH: No such file or directory"
    waiting = {
        "spec": {"containers": [{"name": "training", "image": IMAGE}]},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "training",
                    "state": {"waiting": {"reason": "CreateContainerError", "message": crio}},
                }
            ],
        },
    }
    said = unusable_image(waiting)
    assert said is not None and "no `python` on its PATH" in said


@pytest.mark.parametrize(
    "terminated",
    [
        {"exitCode": 1, "message": "restart budget spent: 10 restarts"},
        {"exitCode": 1, "message": "ModuleNotFoundError: No module named 'slicekeeper_utils'"},
        # The supervisor's own log quoting what a workload said: not the interpreter's line.
        {
            "exitCode": 1,
            "message": "ignored a malformed SDK message b'No module named slicekeeper.supervisor'",
        },
        {"exitCode": 4, "message": "x: python: No module named slicekeeper.supervisor"},
        {"exitCode": 1, "message": "ModuleNotFoundError: No module named 'torch'"},
        {"exitCode": 0, "message": "No module named slicekeeper.supervisor"},  # ended well: not a failure
        {"exitCode": 137, "reason": "OOMKilled"},
        {"exitCode": 128, "reason": "StartError", "message": "mount /data: no such file or directory"},
    ],
    ids=["budget", "a-module-of-the-users", "quoted", "quoted-mid-line", "torch", "exit-0", "oom", "a-mount"],
)
def test_other_ends_are_not_blamed_on_the_image(terminated):
    assert unusable_image(ended(**terminated)) is None


def test_a_pod_waiting_for_its_image_or_running_says_nothing():
    pulling = {"reason": "ContainerCreating"}
    pod = {"spec": {"containers": [{"image": IMAGE}]}, "status": {"phase": "Pending"}}
    assert unusable_image(pod) is None
    pod["status"]["containerStatuses"] = [{"name": "training", "state": {"waiting": pulling}}]
    assert unusable_image(pod) is None

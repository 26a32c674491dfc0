"""The supervisor's API client (supervisor/pod/own_pod.py) pointed at a test's API server, as a pod's is.

A pod's supervisor builds its client once, from the pod's service account or KUBECONFIG, which the
library reads when it is imported; a test builds it afresh against its own server, and monkeypatch
restores the library's and the module's state when the test ends.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest
from slicekeeper.supervisor.pod import own_pod

from tests.support.operator_process import kubeconfig


def point_supervisor_client(server: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kubeconfig(folder / "kubeconfig", server)
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(own_pod, "_client", None)
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", None)

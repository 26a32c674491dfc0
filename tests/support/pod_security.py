"""The Kubernetes Pod Security Standards' "restricted" profile (v1.31), as checks on a pod spec.

The API server's Pod Security admission enforces the profile on a namespace labelled
`pod-security.kubernetes.io/enforce: restricted`; no cluster is at hand here, so these checks follow
the published standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/): the
baseline controls, then the restricted ones. Each violation is named after its control.
"""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUME_KINDS = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """What in `pod_spec` (a Pod's spec, or a pod template's) the restricted profile forbids."""
    found: list[str] = []
    pod_context = pod_spec.get("securityContext") or {}
    containers = [
        *pod_spec.get("initContainers", []),
        *pod_spec.get("containers", []),
        *pod_spec.get("ephemeralContainers", []),
    ]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            found.append(f"host namespaces: {field}")
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_KINDS:
            found.append(f"volume types: {volume['name']} is {sorted(kinds - RESTRICTED_VOLUME_KINDS)}")
    if (pod_context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("seccomp: the pod's profile is Unconfined")
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"privileged containers: {name}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                found.append(f"host ports: {name} {port['hostPort']}")
        capabilities = context.get("capabilities") or {}
        added = set(capabilities.get("add", []))
        if not added <= {"NET_BIND_SERVICE"}:
            found.append(f"capabilities: {name} adds {sorted(added - {'NET_BIND_SERVICE'})}")
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"capabilities: {name} does not drop ALL")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"privilege escalation: {name} does not set allowPrivilegeEscalation false")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            found.append(f"running as non-root: {name} does not set runAsNonRoot")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"running as non-root user: {name} runs as uid 0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"seccomp: {name} has no RuntimeDefault or Localhost profile")
        if context.get("procMount", "Default") != "Default":
            found.append(f"/proc mount type: {name}")
    if pod_context.get("runAsUser") == 0:
        found.append("running as non-root user: the pod runs as uid 0")
    return found

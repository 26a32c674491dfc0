"""What the workload may not read: the job's credentials and, in a pod, the service-account token.
A process started confined (supervisor.host.confinement) is refused them and reads everything else;
started unconfined (the negative control), the same process reads them all."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from slicekeeper.supervisor.host.confinement import (
    SERVICE_ACCOUNT_DIR,
    Confinement,
    landlock_abi,
    readable_roots,
)
from slicekeeper.supervisor.host.site import LocalSite, PodSite
from slicekeeper.supervisor.workload_process import WorkloadProcess

from tests.support.plans import example_plan

needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="no Landlock on this kernel")

TRY = """
import json, sys
outcomes = {}
for path in sys.argv[1:]:
    try:
        open(path, "rb").close()
        outcomes[path] = "read"
    except OSError as error:
        outcomes[path] = type(error).__name__
print(json.dumps(outcomes))
"""


def _tree(tmp_path: Path) -> dict[str, Path]:
    files = {
        "key": tmp_path / "run" / "credentials" / "tls.key",
        "token": tmp_path / "secrets" / "serviceaccount" / "token",
        "next_to_the_key": tmp_path / "run" / "plan.json",
        "elsewhere": tmp_path / "data" / "batch.npy",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    return files


async def _try(files: dict[str, Path], confinement: Confinement | None, log: Path) -> dict[str, str]:
    argv = [sys.executable, "-c", TRY, *map(str, files.values())]
    if confinement is None:
        process = await WorkloadProcess.spawn(argv, {}, log)
    else:
        with confinement.ruleset() as confine:
            process = await WorkloadProcess.spawn(argv, {}, log, before_exec=confine)
    await process.wait()
    opened = json.loads(log.read_text().splitlines()[-1])
    return {name: opened[str(path)] for name, path in files.items()}


@needs_landlock
def test_a_confined_workload_reads_everything_but_the_credentials_and_the_token(tmp_path: Path):
    files = _tree(tmp_path)
    hidden = [files["key"].parent, files["token"].parent]
    confined = asyncio.run(_try(files, Confinement(hidden, say=print), tmp_path / "confined.log"))
    assert confined == {
        "key": "PermissionError",
        "token": "PermissionError",
        "next_to_the_key": "read",
        "elsewhere": "read",
    }
    free = asyncio.run(_try(files, None, tmp_path / "free.log"))
    assert set(free.values()) == {"read"}  # the negative control


def test_the_rules_allow_every_way_but_the_one_to_a_hidden_path(tmp_path: Path):
    files = _tree(tmp_path)
    (tmp_path / "run" / "link").symlink_to(files["key"].parent)
    roots = readable_roots([files["key"].parent], root=tmp_path)
    assert sorted(roots) == [tmp_path / "data", tmp_path / "run" / "plan.json", tmp_path / "secrets"]


def test_in_a_pod_the_token_is_hidden_too_and_locally_the_runs_credentials(tmp_path: Path):
    local = example_plan(tmp_path, local=True)
    assert LocalSite(local).hidden_from_workload() == [Path(local.credentials)]
    pod = example_plan(tmp_path, local=False)
    assert PodSite(pod).hidden_from_workload() == [Path(pod.credentials), SERVICE_ACCOUNT_DIR]


def test_without_landlock_the_supervisor_says_the_workload_is_not_confined(monkeypatch):
    from slicekeeper.supervisor.host import confinement

    monkeypatch.setattr(confinement, "landlock_abi", lambda: 0)
    said: list[str] = []
    unconfined = Confinement([Path("/nowhere")], say=said.append)
    with unconfined.ruleset() as confine:
        assert confine is None
    assert said and "Landlock is not available" in said[0]

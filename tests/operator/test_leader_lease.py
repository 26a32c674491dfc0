"""The job's Lease on an API server (the emulated one): the lock every supervisor of a pod campaigns on.

The election's algorithm is tested on the lease file (tests/unit/test_leader_election.py); here the
same steps run on `coordination.k8s.io/v1` Leases through the official client, whose replace is a
compare-and-swap on the resourceVersion the lock last read: a leader's renewals and its release
must each be based on the lease as it is, or the API server refuses them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from slicekeeper.supervisor.leader.election import Election, Holder, KubernetesLeaseLock, Timing

from slicekeeper import protocol
from tests.support.operator_example import NS, example
from tests.support.operator_harness import Kube, emulated_cluster

pytestmark = pytest.mark.asyncio

FAST = Timing(duration=3, renew_deadline=2, retry=1)
LEASE = "tiny-lm-leader"


@pytest.fixture(autouse=True)
def _default_client_configuration():
    """The official client's default configuration, as it was before the test."""
    saved = client.Configuration.get_default_copy()
    yield
    client.Configuration.set_default(saved)


def use_emulated_api_server(kube: Kube, tmp_path: Path) -> None:
    """The official client configured as a pod of the fake kubelet is (KUBECONFIG)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": kube.url}}],
                "users": [{"name": "pod", "user": {}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "pod"}}],
                "current-context": "emulated",
            }
        )
    )
    config.load_kube_config(str(path))


def candidate(machine: str, host: int) -> Election:
    holder = Holder(machine, host, f"10.0.0.{host}:8490")
    return Election(KubernetesLeaseLock(LEASE, NS, holder.identity(), {protocol.LABEL_JOB: "tiny-lm"}), FAST)


async def test_a_leader_that_renewed_releases_its_lease_and_the_next_takes_it_at_once(tmp_path: Path):
    async with emulated_cluster(watch_seconds=None) as kube:
        use_emulated_api_server(kube, tmp_path)
        first, second = candidate("a-0", 0), candidate("a-1", 1)
        assert await first.step() and first.term == 1  # created
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}"
        created = await kube.request("GET", path)
        assert created["metadata"]["labels"] == {protocol.LABEL_JOB: "tiny-lm"}  # the admission policy's
        assert await first.step() and await first.step()  # renewed twice: newer resourceVersions
        assert not await second.step()  # held
        await first.release()
        released = await kube.request("GET", path)
        assert released["spec"]["holderIdentity"] == "released:" + first.identity
        assert await second.step()  # no need to wait out the duration
        taken = second.taken_from
        assert taken is not None and taken.holder is not None and taken.holder.machine == "a-0"
        lease = await kube.request("GET", path)
        assert lease["spec"]["holderIdentity"] == second.identity
        assert lease["spec"]["leaseTransitions"] == 2 and second.term == 3  # released, then taken
        assert not await first.step()  # it gave the lease up: never again


@pytest.mark.parametrize("owned", [True, False], ids=["owned by the job", "negative control: no owner"])
async def test_the_jobs_lease_goes_with_the_job(tmp_path: Path, owned: bool):
    """Deleting a TrainingJob leaves nothing behind: the garbage collector deletes the Lease its
    supervisors created, through the owner reference each pod's uid variable lets them set."""
    async with emulated_cluster(watch_seconds=None) as kube:
        use_emulated_api_server(kube, tmp_path)
        await kube.apply(example())
        job = kube.job(NS, "tiny-lm")
        owner = ("tiny-lm", job["metadata"]["uid"]) if owned else None
        holder = Holder("a-0", 0, "10.0.0.0:8490")
        lock = KubernetesLeaseLock(LEASE, NS, holder.identity(), {protocol.LABEL_JOB: "tiny-lm"}, owner)
        assert await Election(lock, FAST).step()
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}"
        references = (await kube.request("GET", path))["metadata"].get("ownerReferences")
        if owned:
            assert references == [
                {
                    "apiVersion": protocol.TRAININGJOB_API_VERSION,
                    "kind": protocol.TRAININGJOB_KIND,
                    "name": "tiny-lm",
                    "uid": job["metadata"]["uid"],
                }
            ]
        await kube.delete_job(NS, "tiny-lm")
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"

        async def names() -> list[str]:
            return [lease["metadata"]["name"] for lease in (await kube.request("GET", leases))["items"]]

        if owned:
            deadline = asyncio.get_running_loop().time() + 10
            while await names() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            assert await names() == []
        else:
            await asyncio.sleep(1)
            assert await names() == [LEASE]  # left behind

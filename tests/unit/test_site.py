"""Local or pod, decided once: what a host's supervisor asks its site (supervisor/host/site.py).

Every difference between `slicekeeper run` and a pod for one host is an answer of the site object
chosen at start-up; these are the answers, side by side.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from slicekeeper.supervisor import leader_connection
from slicekeeper.supervisor.host.site import METRICS_TARGETS_DIR, LocalSite, PodSite, site_of
from slicekeeper.supervisor.ports import free_port

from slicekeeper import protocol
from tests.support.plans import example_plan


def test_the_plan_decides_the_site_once(tmp_path):
    assert isinstance(site_of(example_plan(tmp_path, local=True)), LocalSite)
    assert isinstance(site_of(example_plan(tmp_path, local=False)), PodSite)


def test_locally_every_host_shares_the_loopback_address_with_ports_of_its_own(tmp_path):
    plan = dataclasses.replace(example_plan(tmp_path, local=True), metrics_port=9100, leader="127.0.0.1:0")
    site = site_of(plan)
    assert site.bind_address() == "127.0.0.1"
    assert [site.metrics_port(h, f"host-{h}") for h in range(4)] == [9100, 9101, 9102, 9103]
    assert site.metrics_port(-1, "spare-1") == 9105  # after the 4 hosts: a spare keeps it when it takes over
    assert site.leader_wait == leader_connection.LOCAL_WAIT_SECONDS
    assert site.leader_unreachable_exit_code == protocol.EXIT_JOB_FAILED
    assert site.replacement_timeout is None  # spare supervisors stand in
    assert site.pod("host-0") is None and not site.log_events and site.local


def test_in_a_pod_each_host_has_its_address_and_asks_for_a_new_pod_when_no_leader_comes(tmp_path):
    plan = dataclasses.replace(
        example_plan(tmp_path, local=False), metrics_port=9100, address="10.0.0.7", replacement_timeout=30.0
    )
    site = site_of(plan)
    assert site.bind_address() == "10.0.0.7"
    assert site.metrics_port(3, "node-b") == 9100
    assert site.leader_address(3, "10.0.0.7") == ("10.0.0.7:8475", None)  # the pod's own address
    layout = plan.layout
    assert site.coordinator_address(layout, 2) == "tiny-lm-s1-w0.tiny-lm:8476"
    assert site.advertised_address(layout, layout.host(2), "0.0.0.0") == "tiny-lm-s1-w0.tiny-lm"
    assert site.leader_wait == 30.0 and site.replacement_timeout == 30.0
    assert site.leader_unreachable_exit_code == leader_connection.LEADER_UNREACHABLE_EXIT_CODE
    assert site.cores() == [] and site.log_events and not site.local


def test_locally_a_leader_port_is_taken_at_start_up_so_no_other_process_can_take_it(tmp_path):
    """The first leader serves on the plan's port if it is still free, on another otherwise (the
    lease names it): a port chosen by the runtime and taken by another process meanwhile used to
    kill host 0's supervisor at its election."""
    port = free_port()
    site = site_of(dataclasses.replace(example_plan(tmp_path, local=True), leader=f"127.0.0.1:{port}"))
    address, reserved = site.leader_address(0, "127.0.0.1")
    assert address == f"127.0.0.1:{port}" and reserved is not None
    assert reserved.getsockname()[1] == port  # bound now, listened on once elected
    address, other = site.leader_address(0, "127.0.0.1")  # the plan's port is someone else's now
    assert other is not None and address != f"127.0.0.1:{port}"
    later, third = site.leader_address(2, "127.0.0.1")
    assert third is not None and later not in (f"127.0.0.1:{port}", address)
    for sock in (reserved, other, third):
        sock.close()


def test_locally_each_machine_tells_prometheus_where_its_metrics_are_labelled_as_the_job(tmp_path):
    plan = dataclasses.replace(example_plan(tmp_path, local=True), leader="127.0.0.1:0")
    site = site_of(plan)
    Path(plan.run_dir).mkdir(parents=True)  # the runtime's, made before any supervisor starts
    site.announce_metrics("spare-0", "127.0.0.1", 9104)
    site.announce_metrics("host-1", "127.0.0.1", 9101)
    folder = Path(plan.run_dir) / METRICS_TARGETS_DIR
    labels = {"namespace": "default", "trainingjob": plan.training_job.metadata.name, "pod": "spare-0"}
    assert json.loads((folder / "spare-0.json").read_text()) == [
        {"targets": ["127.0.0.1:9104"], "labels": labels}
    ]
    site.announce_metrics("spare-0", "127.0.0.1", 9200)  # a restarted supervisor on a new port
    assert json.loads((folder / "spare-0.json").read_text())[0]["targets"] == ["127.0.0.1:9200"]
    assert sorted(p.name for p in folder.iterdir()) == ["host-1.json", "spare-0.json"]  # nothing half-written


def test_in_a_pod_nothing_is_written_for_prometheus(tmp_path):
    plan = dataclasses.replace(example_plan(tmp_path, local=False), address="10.0.0.7")
    Path(plan.run_dir).mkdir(parents=True, exist_ok=True)
    site_of(plan).announce_metrics("host-0", "0.0.0.0", 9100)
    assert not (Path(plan.run_dir) / METRICS_TARGETS_DIR).exists()

"""Only a job's own supervisors get into its supervisors' ports (issue 15's acceptance).

A `slicekeeper run` goes on while a process without the job's credentials connects to the leader's
port and to a host's peer-tier port, in plain TCP, in TLS without a certificate and in TLS with
another job's certificate, and tries to fetch a shard, push a poisoned one, claim a host's identity
and watch the job. Every attempt is refused before anything is answered, each refusal is counted on
the supervisor that refused it and said once in its log, and the job ends with the parameters of a
run nobody disturbed. The negative control: the same client with the job's own credentials is
answered, so the refusals are the credentials' doing, not the client's. Nothing of the job's private
key appears in anything the run wrote or served.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from slicekeeper.supervisor.leader.election import LEASE_FILE, read_lease_file
from slicekeeper.supervisor.ports import free_port_block

from slicekeeper import credentials
from tests.support import intruder
from tests.support.cli_runs import (
    read_report,
    sdk_loop_fingerprint,
    sdk_loop_job,
    started_cli,
    supervisor_of,
)
from tests.support.secrets import leaked_fragments

HOSTS = 4
STEPS = 160


def _wait_for(condition, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def _started(run_dir: Path, host: int) -> bool:
    events = run_dir / f"host-{host}" / "events.jsonl"
    return events.exists() and '"type": "start"' in events.read_text()


def _refused(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.labels["port"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "slicekeeper_refused_connections_total"
    }, text


def test_without_the_jobs_credentials_nothing_gets_in_and_the_job_ends_as_if_nobody_tried(tmp_path):
    base = free_port_block(HOSTS)
    job = sdk_loop_job(
        tmp_path / "job.yaml", steps=STEPS, local={"metricsPort": base, "workDir": str(tmp_path / "runs")}
    )
    report_path = tmp_path / "report.json"
    other_job = credentials.generate("another-job").write(tmp_path / "another-job")
    with started_cli("run", str(job), "--report", str(report_path)) as cli:
        assert cli.stdout is not None
        printed = []
        for line in cli.stdout:
            printed.append(line)
            if "run directory:" in line:
                run_dir = Path(line.split("run directory:")[1].split()[0])
                break
        _wait_for(lambda: all(_started(run_dir, h) for h in range(HOSTS)), "every host started")
        lease = read_lease_file(run_dir / LEASE_FILE)
        assert lease is not None and lease.leader is not None and lease.leader.host == 0
        leader_port = int(lease.leader.address.rsplit(":", 1)[1])
        [peer_port] = intruder.listening_ports(supervisor_of(str(run_dir), "host-1")) - {base + 1}

        attempts = {
            "leader": [intruder.leader_message()],
            "peer": [intruder.fetch_request(owner=1, step=5), intruder.push_request(owner=0, step=5)],
        }
        ports = {"leader": leader_port, "peer": peer_port}
        for name, payloads in attempts.items():
            for payload in payloads:
                assert intruder.plain(ports[name], payload) == b"", name
                assert intruder.tls(ports[name], payload, None) == b"", name
                assert intruder.tls(ports[name], payload, other_job) == b"", name

        refused_by_leader, leader_metrics = _refused(base + 0)
        refused_by_peer, peer_metrics = _refused(base + 1)
        assert refused_by_leader.get("leader") == 3 and refused_by_leader.get("peer", 0) == 0
        assert refused_by_peer.get("peer") == 6 and refused_by_peer.get("leader", 0) == 0

        # The negative control: the same client, with the job's own credentials, is answered.
        own = run_dir / "credentials"
        answer = intruder.tls(peer_port, intruder.fetch_request(owner=1, step=10**6), own)
        assert json.loads(answer.splitlines()[0])["ok"] is False  # "not held": a request was read
        watched = intruder.tls(leader_port, b'{"type": "watch"}\n', own, first_line=True)
        assert json.loads(watched.splitlines()[0])["type"] in ("status", "event")
        out, err = cli.communicate()
        assert cli.returncode == 0, err[-3000:]

    report = read_report(report_path)
    assert report["params_fingerprint"] == sdk_loop_fingerprint(STEPS)
    assert report["restores"] == [] and report["hot_swaps"]["count"] == 0
    for host, expected in ((0, "leader"), (1, "peer")):
        log = (run_dir / f"host-{host}" / "supervisor.log").read_text()
        said = [line for line in log.splitlines() if "refused a connection from 127.0.0.1" in line]
        assert len(said) == 1 and f"to the {expected} port" in said[0], said

    texts = {"stdout": "".join(printed) + out, "stderr": err, "metrics": leader_metrics + peer_metrics}
    assert leaked_fragments(own, texts, run_dir) == []

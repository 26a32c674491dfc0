"""A real Prometheus (Debian's package) for a test: started on a free port with a configuration of
the test's, scraping and evaluating every second, queried through its HTTP API, stopped at the end."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from slicekeeper.supervisor.ports import free_port

from tests.support.prometheus import tool


class QueryFailed(Exception):
    """Prometheus refused a query (its error type and message)."""


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[str]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector `expr` gives (at `at`, Unix seconds; default now); QueryFailed if Prometheus
        refuses it."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        request = urllib.request.Request(
            f"{self.url}/api/v1/query", data=urllib.parse.urlencode(params).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:  # 400 / 422: a bad or failing expression
            answer = json.loads(error.read())
        if answer["status"] != "success":
            raise QueryFailed(f"{answer.get('errorType')}: {answer.get('error')}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The one value `expr` gives now (None: no series)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            active: list[dict[str, Any]] = json.loads(response.read())["data"]["activeTargets"]
        return active


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def running_prometheus(where: Path, target_files: list[str], rule_files: list[Path]) -> Iterator[Prometheus]:
    """Prometheus scraping the file_sd targets `target_files` (globs) every second and evaluating
    `rule_files` every second, its data in `where`; ready when the block starts, stopped when it ends."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "slicekeeper",
                "file_sd_configs": [{"files": target_files, "refresh_interval": "1s"}],
            }
        ],
    }
    (where / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (where / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={where / 'prometheus.yml'}",
            f"--storage.tsdb.path={where / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = Prometheus(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (where / "prometheus.log").read_text()
            if _ready(server.url):
                break
            assert time.monotonic() < deadline, "Prometheus not ready within 60 s"
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()

"""The job's private key never leaves its credentials: what `slicekeeper render` prints holds none,
and the search for it (tests/support/secrets.py, used by the acceptance and operator tests) finds it
wherever it does appear, in every form: the negative controls."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from slicekeeper.operator.render import render

from slicekeeper import credentials
from slicekeeper.api import load_training_job
from tests.support.cli_runs import ROOT, run_cli
from tests.support.secrets import leaked_fragments

EXAMPLE = ROOT / "examples" / "trainingjob.yaml"


def test_slicekeeper_render_prints_no_secret_and_no_key():
    result = run_cli("render", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    kinds = [document["kind"] for document in yaml.safe_load_all(result.stdout)]
    assert "Secret" not in kinds
    assert "PRIVATE KEY" not in result.stdout and "tls.key:" not in result.stdout


def test_the_search_finds_the_key_in_a_secret_a_log_line_and_a_file(tmp_path: Path):
    own = credentials.generate("tiny-lm").write(tmp_path / "credentials")
    key = (own / credentials.KEY_FILE).read_text()
    secret = render(load_training_job(EXAMPLE)).credentials_secret(
        credentials.JobCredentials(
            (own / credentials.CA_FILE).read_bytes(),
            (own / credentials.CERT_FILE).read_bytes(),
            (own / credentials.KEY_FILE).read_bytes(),
        )
    )
    log_line = f"loaded {key.splitlines()[2]} from the Secret"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "copied.pem").write_text(key)
    found = leaked_fragments(
        own, {"secret": json.dumps(secret), "log": log_line, "clean": "nothing here"}, tmp_path / "run"
    )
    assert {entry.split(":")[0] for entry in found} == {"secret", "log", str(tmp_path / "run" / "copied.pem")}
    assert leaked_fragments(own, {"certificate": (own / credentials.CERT_FILE).read_text()}, own) == []

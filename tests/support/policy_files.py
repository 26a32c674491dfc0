"""A user's policy file for the policy engine's tests (tests/unit/test_policy_engine.py and
test_policy_engine_loading.py): written under a test's directory with the API imported, the example
policies the project ships, and the crash most tests decide on.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from slicekeeper.policy import Crash

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "policies").glob("*.py"))
HEADER = "from slicekeeper.policy import *\n"


def policy_file(tmp_path: Path, body: str, name: str = "policy.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def crash(host: int = 1, t: float = 999.0) -> Crash:
    return Crash(host=host, exit_code=1, signal=None, detail="", t=t, step=40, generation=1)

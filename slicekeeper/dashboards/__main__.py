"""`python -m slicekeeper.dashboards DIR`: write every dashboard's JSON into DIR (`make dashboards`)."""

from __future__ import annotations

import sys
from pathlib import Path

from slicekeeper.dashboards import DASHBOARDS, render


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m slicekeeper.dashboards DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    folder.mkdir(parents=True, exist_ok=True)
    for name in DASHBOARDS:
        (folder / f"{name}.json").write_text(render(name))
        print(f"wrote {folder / name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Looking for a job's private key where it must never be: logs, reports, events, metrics, manifests.

The key is looked for in every form it could leak in: any line of its PEM body (a log line quoting
part of the file), the whole file base64-encoded (a Secret's `data`), and its raw bytes hex-encoded.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from pathlib import Path

from slicekeeper import credentials


def key_fragments(key_pem: bytes) -> list[bytes]:
    """The forms of the private key a leak would show."""
    body = [line for line in key_pem.splitlines() if line and not line.startswith(b"-----")]
    raw = base64.b64decode(b"".join(body))
    return [*body, base64.b64encode(key_pem), raw.hex().encode(), raw]


def leaked_fragments(
    credentials_dir: Path, texts: Mapping[str, str | bytes], *directories: Path
) -> list[str]:
    """Where a fragment of the key in `credentials_dir` appears: in `texts` (name -> content) or in
    any file under `directories` (the credentials directory itself excepted)."""
    fragments = key_fragments((credentials_dir / credentials.KEY_FILE).read_bytes())
    found = []
    for name, content in [*texts.items(), *_files(credentials_dir, directories)]:
        data = content.encode() if isinstance(content, str) else content
        found += [f"{name}: {fragment[:16]!r}..." for fragment in fragments if fragment in data]
    return found


def _files(excluded: Path, directories: Iterable[Path]) -> Iterable[tuple[str, bytes]]:
    for directory in directories:
        for path in directory.rglob("*"):
            if path.is_file() and excluded.resolve() not in path.resolve().parents:
                yield str(path), path.read_bytes()

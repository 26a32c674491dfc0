"""Where a host's SDK socket goes, which is not always where its files go.

A Unix socket's address holds at most 107 bytes of path. The socket belongs in the host's own
directory, but a user's work directory may be deep enough that `<run dir>/host-N/sdk.sock` does not
fit; then it goes to a private directory of the system's temporary directory instead, named after
the host's directory so that a restarted supervisor listens where its workload's environment says.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from slicekeeper.errors import UserError

SOCKET_PATH_MAX = 107
"""The bytes of a path a Unix socket's address holds on Linux (sun_path is 108 with its NUL)."""


def sdk_socket_path(directory: Path) -> Path:
    """Where a host's SDK socket goes: `directory/sdk.sock`, or, when that path is too long for a
    Unix socket's address (a deep work directory), `sdk.sock` in a directory of the system's
    temporary directory named after `directory`, so a restarted supervisor finds the same one. That
    directory is private (0700, this user's); one that exists otherwise is refused (UserError): in
    a shared /tmp another user could have made it first to listen in place of the supervisor."""
    path = directory / "sdk.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(directory.resolve())).hexdigest()[:16]
    private = Path(tempfile.gettempdir()) / f"slicekeeper-sdk-{digest}"
    with contextlib.suppress(FileExistsError):
        private.mkdir()
        private.chmod(0o700)
    found = private.lstat()
    private_to_us = stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid()
    if not private_to_us or stat.S_IMODE(found.st_mode) != 0o700:
        raise UserError(
            f"{private} (the SDK socket's place for {directory}) is not a directory only this user may use"
        )
    return private / "sdk.sock"


def remove_sdk_socket(path: Path, directory: Path) -> None:
    """Remove the socket `sdk_socket_path(directory)` gave, and its private directory if it made one."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if path.parent != directory:
        with contextlib.suppress(OSError):
            path.parent.rmdir()

"""A host's SDK socket is listened on wherever its host directory is, however deep."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slicekeeper.supervisor.host.sdk_socket import SOCKET_PATH_MAX, remove_sdk_socket, sdk_socket_path

from slicekeeper.errors import UserError


@pytest.fixture
def temp_root(monkeypatch) -> Iterator[Path]:
    """The system's temporary directory, for these tests: a fresh one as short as /tmp's, whatever
    pytest's own base (a worker's tmp_path under pytest-xdist is too deep to hold a socket)."""
    root = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _deep(tmp_path: Path) -> Path:
    directory = tmp_path / ("runs-" + "x" * 80) / "host-1"
    directory.mkdir(parents=True)
    return directory


def _listen(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))


def test_a_host_directory_with_room_holds_its_socket(tmp_path, temp_root):
    assert sdk_socket_path(tmp_path) == tmp_path / "sdk.sock"
    assert list(temp_root.iterdir()) == []


def test_a_deep_host_directory_gets_a_private_place_that_a_restart_finds_again(tmp_path, temp_root):
    deep = _deep(tmp_path)
    with pytest.raises(OSError, match="too long"):  # the control: where it cannot listen
        _listen(deep / "sdk.sock")
    path = sdk_socket_path(deep)
    assert len(str(path)) <= SOCKET_PATH_MAX and path.parent.parent == temp_root
    assert path.parent.stat().st_mode & 0o777 == 0o700
    _listen(path)
    assert sdk_socket_path(deep) == path  # the restarted supervisor's
    other = tmp_path / ("runs-" + "y" * 80) / "host-1"
    other.mkdir(parents=True)
    assert sdk_socket_path(other).parent != path.parent
    remove_sdk_socket(path, deep)
    assert not path.parent.exists() and deep.exists()


def test_a_private_place_someone_else_could_use_is_refused_by_name(tmp_path, temp_root):
    deep = _deep(tmp_path)
    place = sdk_socket_path(deep).parent
    place.chmod(0o755)
    with pytest.raises(UserError, match=f"{place}.*not a directory only this user may use"):
        sdk_socket_path(deep)

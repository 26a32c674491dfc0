"""The host supervisor's end of the workload SDK's socket, for the SDK's tests
(tests/unit/test_workload_sdk.py and test_workload_sdk_identity.py): a fake supervisor that keeps
every line a workload sends, and the environment a supervisor hands its workload.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from slicekeeper import protocol

WAIT = 5.0


class FakeSupervisor:
    """A Unix socket server that accepts one workload and keeps every line it sends."""

    def __init__(self, path: Path, close_at_once: bool = False) -> None:
        self.path = path
        self.lines: list[bytes] = []
        self._close_at_once = close_at_once
        self.accepted = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(1)
        self._server.settimeout(WAIT)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._server.accept()
        self.accepted.set()
        with connection:
            if self._close_at_once:
                return
            connection.settimeout(WAIT)
            buffer = b""
            while chunk := connection.recv(65536):
                buffer += chunk
            self.lines = buffer.splitlines()

    def messages(self) -> list[dict]:
        """Every message, once the workload has closed its end."""
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the workload never closed its connection"
        return [protocol.decode(line) for line in self.lines]

    def close(self) -> None:
        self._server.close()


def env_for(path: Path | None, **extra: str) -> dict[str, str]:
    """The environment of host 1 of 4 in generation 2, talking to the supervisor at `path` (None:
    standalone), with `extra` on top."""
    env = {protocol.ENV_HOST: "1", protocol.ENV_NUM_HOSTS: "4", protocol.ENV_GENERATION: "2", **extra}
    if path is not None:
        env[protocol.ENV_SOCKET] = str(path)
    return env

"""Supervisors forked from one process that imported them once: `slicekeeper run`'s machines start
in milliseconds, not in the second of CPU each fresh interpreter spends importing the supervisor.

A supervisor's imports (the Kubernetes client its election uses, pydantic's models, cryptography)
cost about 0.9 s of CPU, and a local run starts one per host and per spare, and again for every
supervisor killed by a fault: more than half of what a short run's supervisors spend. The fork
server is started once per run, imports the supervisor, freezes what it imported out of the garbage
collector's reach (so that a fork shares those pages instead of copying them), and then only forks:
each child becomes one machine's supervisor, as `python -m slicekeeper.supervisor ARGS` would.

The run (`SupervisorForks`, in the CLI's event loop) and the server talk over a socket pair:
- a start request carries the supervisor's arguments, environment, working directory and process
  group id, and its log file as a file descriptor; the answer carries the child's pid and a pidfd of
  it, through which the run signals it, whoever reaps it;
- the server is the children's parent: it sees each end (its own pidfd of the child), kills what the
  child left in its process group while its pid still names that group (the child a zombie), reaps
  it, and sends its exit code (minus the signal that killed it).

The server lives in its own session (a Ctrl-C at the terminal is the run's to handle: SIGTERM to
each supervisor, then SIGKILL), dies with the run (PDEATHSIG), and its children die with it; when
the run closes its end, it kills what is left and exits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass
from typing import Final

from slicekeeper.supervisor.workload_process import die_with_parent

MESSAGE_LIMIT: Final = 1 << 20
"""The largest message either side sends (a start request carries the environment)."""
SERVER_GONE: Final = 256
"""A supervisor's code when the fork server ended before it did (not an exit code: those are
0-255, or minus a signal)."""


SUPERVISOR: Final = "slicekeeper.supervisor.__main__:main"
"""The entry point of a machine's supervisor (`python -m slicekeeper.supervisor`)."""


@dataclass(frozen=True)
class StartRequest:
    """One process to fork: `entry` ("module:function", called with `args`, returning the exit
    code), shown as `title` in its command line."""

    entry: str
    args: list[str]
    title: str
    env: dict[str, str]
    cwd: str
    group: int | None

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def decode(cls, data: bytes) -> StartRequest:
        return cls(**json.loads(data))


class ForkedSupervisor:
    """One supervisor the fork server started, held through a pidfd the server sent: signalled
    through it (never by a number the kernel may have handed out again); its end is the server's
    word, sent once the server reaped it."""

    def __init__(self, pid: int, pidfd: int, ended: asyncio.Future[int]) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._ended = ended
        self.returncode: int | None = None
        """Its exit code (minus the signal that killed it), or SERVER_GONE; None while it runs."""
        ended.add_done_callback(self._reaped)

    async def wait(self) -> int:
        # Shielded: a waiter given up on (a timeout) must not cancel the end other waiters await.
        return await asyncio.shield(self._ended)

    def send_signal(self, signum: signal.Signals) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)

    def kill_group(self) -> None:
        """SIGKILL its process group, while that is still its own (the server kills the group again
        before it reaps it)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def _reaped(self, ended: asyncio.Future[int]) -> None:
        self.returncode = ended.result()
        os.close(self._pidfd)


class SupervisorForks:
    """The run's side of the fork server: `start` a supervisor, `close` when the run is over."""

    def __init__(self, server: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self._server = server
        self.pid = server.pid
        """The fork server's pid."""
        self._channel = channel
        self._loop = asyncio.get_running_loop()
        self._starting: collections.deque[asyncio.Future[ForkedSupervisor]] = collections.deque()
        self._ends: dict[int, asyncio.Future[int]] = {}
        """The end of each child still running, by pid (a pid is only this child's until its end)."""
        self._loop.add_reader(channel.fileno(), self._read)

    @classmethod
    async def launch(cls, title: str) -> SupervisorForks:
        """Start the fork server (`title`: what its command line names, e.g. the run's folder, so
        that its processes are found by it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            server = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), title],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(server, ours)

    async def start(
        self, args: list[str], log: int, group: int | None = None, entry: str = SUPERVISOR
    ) -> ForkedSupervisor:
        """Fork one supervisor with `args`, its output to file descriptor `log`, under group id
        `group` (None: this process's); `entry`: what the child runs (tests stand programs in)."""
        command = "python -m slicekeeper.supervisor" if entry == SUPERVISOR else entry
        request = StartRequest(entry, args, " ".join([command, *args]), dict(os.environ), os.getcwd(), group)
        started: asyncio.Future[ForkedSupervisor] = self._loop.create_future()
        self._starting.append(started)
        socket.send_fds(self._channel, [request.encode()], [log])
        return await started

    async def close(self) -> None:
        """The run is over: the server kills what is left of its children and exits."""
        self._loop.remove_reader(self._channel.fileno())
        self._channel.close()
        self._lost("the fork server was closed")
        await asyncio.to_thread(self._server.wait)

    def _read(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self._channel, MESSAGE_LIMIT, 1)
        except BlockingIOError:
            return
        if not data:
            self._loop.remove_reader(self._channel.fileno())
            self._lost(f"the fork server ended (exit code {self._server.poll()})")
            return
        message = json.loads(data)
        if "started" in message:
            # Its end is awaited from here on: the server's next message may be that end.
            pid, pidfd = message["started"], fds[0]
            self._ends[pid] = self._loop.create_future()
            child = ForkedSupervisor(pid, pidfd, self._ends[pid])
            started = self._starting.popleft()
            if started.cancelled():  # whoever asked gave up: nobody would stop it
                child.kill_group()
            else:
                started.set_result(child)
        elif "failed" in message:
            self._starting.popleft().set_exception(OSError(f"fork server: {message['failed']}"))
        else:
            self._ends.pop(message["ended"]).set_result(message["code"])

    def _lost(self, why: str) -> None:
        """No answer will come: starts fail, and supervisors still running end as SERVER_GONE."""
        while self._starting:
            self._starting.popleft().set_exception(OSError(why))
        for ended in self._ends.values():
            if not ended.done():
                ended.set_result(SERVER_GONE)


# -- the server's side --------------------------------------------------------------------------


class Children:
    """The server's children, each watched through a pidfd: at its end, its process group is killed
    while the child is a zombie (its pid still names the group), then it is reaped and its code sent."""

    def __init__(self, channel: socket.socket, selector: selectors.BaseSelector) -> None:
        self._channel = channel
        self._selector = selector
        self.pidfds: dict[int, int] = {}

    def add(self, pid: int) -> int:
        pidfd = os.pidfd_open(pid)
        self.pidfds[pid] = pidfd
        self._selector.register(pidfd, selectors.EVENT_READ, pid)
        return pidfd

    def ended(self, pid: int) -> None:
        pidfd = self.pidfds[pid]
        if os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        self._selector.unregister(pidfd)
        os.close(self.pidfds.pop(pid))
        if status is not None:
            code = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
            with contextlib.suppress(OSError):
                self._channel.send(json.dumps({"ended": pid, "code": code}).encode())

    def kill_all(self) -> None:
        for pid, pidfd in list(self.pidfds.items()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            os.close(pidfd)
        self.pidfds.clear()


def serve(channel: socket.socket) -> tuple[StartRequest, int] | None:
    """Answer start requests until the run closes its end (None). In a forked child it returns that
    child's request and log descriptor, with every descriptor of the server's closed."""
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ, None)
    children = Children(channel, selector)
    while True:
        for key, _ in selector.select():
            if key.data is not None:
                children.ended(key.data)
                continue
            data, fds, _, _ = socket.recv_fds(channel, MESSAGE_LIMIT, 1)
            if not data:
                children.kill_all()
                selector.close()
                return None
            request = StartRequest.decode(data)
            try:
                pid = os.fork()
            except OSError as error:
                os.close(fds[0])
                channel.send(json.dumps({"failed": str(error)}).encode())
                continue
            if pid == 0:
                for pidfd in children.pidfds.values():
                    os.close(pidfd)
                selector.close()
                channel.close()
                return request, fds[0]
            os.close(fds[0])
            pidfd = children.add(pid)
            socket.send_fds(channel, [json.dumps({"started": pid}).encode()], [pidfd])


def become_supervisor(request: StartRequest, log: int, server: int) -> int:
    """In a forked child of process `server`: set up as `subprocess.Popen(argv, start_new_session=True,
    group=..., stdout=log, stderr=STDOUT, preexec_fn=die_with_parent)` would, then run the supervisor.

    `server` is the server's pid as the server knew it, not this child's parent read here: on a
    loaded machine the server may be killed before its child runs a line, and a child reading its
    parent then reads the process it was handed to, sets PDEATHSIG on that one and outlives the run
    (seen in a whole run of the suite: three stand-ins still running 5 s after their server's end)."""
    os.setsid()
    if request.group is not None:
        os.setregid(request.group, request.group)
    die_with_parent()
    if os.getppid() != server:  # the server ended before PDEATHSIG was set
        return 1
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    import setproctitle  # imported by the server already (main): here only looked up

    setproctitle.setproctitle(request.title)  # before the environment changes: it finds its area there
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    module, function = request.entry.split(":")
    sys.argv = [module, *request.args]
    try:
        return int(getattr(importlib.import_module(module), function)(request.args))
    except SystemExit as exit:  # as the interpreter reads it: None is 0, a message 1
        return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1


def main(argv: list[str]) -> int:
    """`python -m slicekeeper.supervisor.local.fork_server FD TITLE`: serve on socket FD."""
    channel = socket.socket(fileno=int(argv[0]))
    import setproctitle  # noqa: F401
    import slicekeeper.supervisor.__main__  # noqa: F401

    # What every child would import, frozen: no collection in a child touches (and copies) its pages.
    gc.freeze()
    server = os.getpid()
    forked = serve(channel)
    if forked is None:
        return 0
    request, log = forked
    code = become_supervisor(request, log, server)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

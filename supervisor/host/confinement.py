"""Keeping the training process away from the job's credentials and the pod's service-account token.

The supervisor and the workload it starts run as one user in one container: file modes cannot tell
them apart, and a restricted pod has no capability to unmount or to run the workload as another user.
Landlock can: an unprivileged process may give up rights for itself and its children, and a
Landlock-confined process cannot trace (or read the memory of) one outside its domain either. The
workload is started confined: it may read any file except beneath the hidden paths.

Landlock rules allow; nothing denies. So the rules allow reading beneath every entry of every
directory on the way from `/` to a hidden path, except the next directory on that way and the
hidden path itself (and symbolic links, whose targets have entries of their own). What this costs:
an entry created directly in one of those directories after the workload started (e.g. `/run/x`
in a pod, `/tmp/x` for a local run in /tmp) is not readable by it; files created deeper are. The
workload's TMPDIR is therefore a directory of its machine's own (supervisor.host.workload).

The rules are built again for each process started, so that what exists then is readable, and only
the two system calls that apply them run in the child, between fork and exec.

Landlock needs Linux 5.13 or later with Landlock enabled (`lsm=...,landlock`: Ubuntu, Fedora, COS
since 105), and a seccomp profile that allows its calls (the container runtimes' default ones do);
where it is missing the supervisor says so and starts the workload unconfined. The `landlock`
package on PyPI (an alpha) offers no way to close a ruleset, so these few calls are made here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where Kubernetes mounts the pod's service-account token."""

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and arm64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_READ_FILE, _READ_DIR = 1 << 2, 1 << 3
READ = _READ_FILE | _READ_DIR
"""The rights confined: reading files and listing directories (writing, executing stay as they were)."""
_PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the kernel's uapi header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or a seccomp filter forbids it)."""
    version = _libc.syscall(
        _CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(int(version), 0)


def readable_roots(hidden: Iterable[Path], root: Path = Path("/")) -> list[Path]:
    """The paths beneath which everything stays readable, so that nothing beneath `hidden` is."""
    hidden_set = {path.resolve() for path in hidden if path.exists()}
    on_the_way = {parent for path in hidden_set for parent in path.parents}
    roots: list[Path] = []

    def walk(directory: Path) -> None:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                path = Path(entry.path)
                if path in hidden_set or entry.is_symlink():
                    continue
                if path in on_the_way:
                    walk(path)
                else:
                    roots.append(path)

    if hidden_set:
        walk(root)
    return roots


class Confinement:
    """What the workload may not read: `hidden` paths (those that exist when it starts)."""

    def __init__(self, hidden: list[Path], say: Callable[[str], None]) -> None:
        self.hidden = hidden
        self.available = landlock_abi() > 0
        if not self.available:
            say(
                "Landlock is not available on this kernel: the workload can read the job's "
                f"credentials ({', '.join(map(str, hidden))}); docs/security.md says what it needs"
            )

    @contextlib.contextmanager
    def ruleset(self) -> Iterator[Callable[[], None] | None]:
        """A ruleset for one process about to start, and the function its child runs before exec to
        apply it (None: nothing to confine). The ruleset is closed when the block ends."""
        if not self.available or not any(path.exists() for path in self.hidden):
            yield None
            return
        attr = _RulesetAttr(READ)
        fd = int(_libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0))
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
        try:
            for path in readable_roots(self.hidden):
                _allow(fd, path)
            yield lambda: _restrict(fd)
        finally:
            os.close(fd)


def _allow(ruleset: int, path: Path) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone meanwhile: nothing to allow
    try:
        rights = READ if path.is_dir() else _READ_FILE  # a file takes only the rights of a file
        rule = _PathBeneathAttr(rights, target)
        if _libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"landlock_add_rule {path}: {os.strerror(errno)}")
    finally:
        os.close(target)


def _restrict(ruleset: int) -> None:
    """In the child, between fork and exec: no new privileges (Landlock's condition), then confined."""
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if _libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")

"""Who leads a job, and the term every one of its commands carries.

Any host's supervisor can lead; at any moment the one that holds the job's lease does. The election
is Kubernetes' own (`kubernetes.leaderelection`, the algorithm client-go's components use): every
candidate reads the lease each `retry` seconds, a holder renews it, and a candidate takes it over
once it has seen the same record, unrenewed, for `duration` seconds. The record lives:
- in a cluster, in a `coordination.k8s.io/v1` Lease named after the job (`KubernetesLeaseLock`);
- locally (`slicekeeper run`), in a file of the run directory, changed under an exclusive `flock`
  (`FileLeaseLock`): the same compare-and-swap an API server gives a Lease's resourceVersion.

The holder's identity names its machine, the host it serves and the address of its leader server
(`Holder`), so members find the new leader from the lease itself. Each change of holder increments
the lease's transitions: that count is the term, the fencing token. A leader stamps its term on
every command and a member ignores a command from a term older than the newest it has seen; a
leader also stops acting the moment it cannot be sure it still holds the lease (`Election.leading`:
its last renewal is older than `renew_deadline`, e.g. after a pause), before any I/O tells it so.

A lease is given up by writing its holder back marked released (`RELEASED`): a leader whose process
ends releases its own, and a supervisor started again on the same machine releases the one its dead
predecessor held (`release_predecessor`). As in client-go, a released lease is free at once, and the
record still says who held it last, so the next leader knows whose host to treat as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection.electionconfig import Config
from kubernetes.leaderelection.leaderelection import LeaderElection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from slicekeeper import protocol

logging.getLogger("leaderelection").setLevel(logging.WARNING)  # it logs every retry at INFO


@dataclass(frozen=True)
class Timing:
    """The lease's periods, in whole seconds (the library's rule: duration > deadline > 1.2 retry)."""

    duration: int
    """A record unrenewed this long is taken over."""
    renew_deadline: int
    """A leader whose last renewal is older than this stops acting."""
    retry: int
    """How often every candidate reads (and a holder renews) the lease."""
    renewals_per_retry: int = 2
    """How often a holder renews within a `retry` (each renewal a read and a write): twice where
    nothing is shared and a renewal may be slowed by a loaded machine; once against a shared API
    server, whose deadline leaves room for two more tries."""


LOCAL_TIMING = Timing(duration=3, renew_deadline=2, retry=1)
"""Locally: every supervisor on one machine; a lost leader is replaced within about 4 s."""
CLUSTER_TIMING = Timing(duration=8, renew_deadline=5, retry=2, renewals_per_retry=1)
"""In a cluster: the API server is shared; a lost leader's pod is replaced within about 10 s. At rest
the holder makes a read and a write every 2 s and each other candidate a read: 2 requests a second
with 3 candidates (spec.controlPlane.leaseCandidates, with relays)."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lease: its machine, the host it serves, where its leader server listens, and
    which run of its supervisor (a supervisor restarted on the same machine is another candidate)."""

    machine: str
    host: int
    address: str
    incarnation: str = field(default_factory=lambda: secrets.token_hex(4))

    def identity(self) -> str:
        return f"{self.machine}/{self.host}@{self.address}#{self.incarnation}"

    @classmethod
    def parse(cls, identity: str) -> Holder | None:
        """None for an identity this job's supervisors did not write."""
        with contextlib.suppress(ValueError):
            rest, incarnation = identity.rsplit("#", 1)
            who, address = rest.rsplit("@", 1)
            machine, host = who.rsplit("/", 1)
            return cls(machine, int(host), address, incarnation)
        return None


RELEASED = "released:"
"""Prefixed to the identity of a lease's last holder when the lease was given up."""


@dataclass(frozen=True)
class Lease:
    """One reading of the lease: its holder (None: no valid holder), the term, when it was renewed;
    `released`: the holder gave it up (nobody leads; the next candidate takes it at once)."""

    holder: Holder | None
    term: int
    renewed_at: float
    released: bool = False

    @property
    def leader(self) -> Holder | None:
        """Who leads according to this reading: its holder, unless it released the lease."""
        return None if self.released else self.holder

    def identity(self) -> str | None:
        """The holder's identity as the lease records it (Lease.of reads it back)."""
        if self.holder is None:
            return None
        return (RELEASED if self.released else "") + self.holder.identity()

    @classmethod
    def of(cls, identity: str | None, term: int, renewed_at: float) -> Lease:
        identity = identity or ""
        released = identity.startswith(RELEASED)
        return cls(Holder.parse(identity.removeprefix(RELEASED)), term, renewed_at, released)


class RequestCount:
    """The lease requests (reads, creations, updates) one lock made: a job's cost to the API server
    (issue 41). Counted from the event loop's threads and the renewal thread alike."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._mutex:
            self.value += 1


class FileLeaseLock:
    """A lease record in a JSON file, for the candidates of one machine (kubernetes' lock interface).

    `get` remembers the version read; `update` succeeds only if the file still has that version (the
    check and the write under one exclusive flock), like a Lease's resourceVersion."""

    def __init__(self, path: Path, identity: str) -> None:
        self.path = path
        self.name, self.namespace = path.name, ""
        self.identity = identity
        self._version: int | None = None
        self.transitions = 0
        self.requests = RequestCount()

    def _read(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn file cannot happen (replace is atomic); treat as absent anyway

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        self.requests.add()
        with self._locked():
            data = self._read()
        if data is None:
            return False, _NotFound()
        self._version, self.transitions = int(data["version"]), int(data["transitions"])
        return True, LeaderElectionRecord(
            data["holder"] or None, str(data["duration"]), data["acquire_time"], data["renew_time"]
        )

    def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        self.requests.add()
        with self._locked():
            if self._read() is not None:
                return False
            self._write(election_record, version=1, transitions=0)
        self._version, self.transitions = 1, 0
        return True

    def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        self.requests.add()
        with self._locked():
            data = self._read()
            if data is None or self._version is None or int(data["version"]) != self._version:
                return False  # changed since read: another candidate got there first
            holder = updated_record.holder_identity or ""
            transitions = int(data["transitions"]) + (data["holder"] != holder)
            self._write(updated_record, version=self._version + 1, transitions=transitions)
        self._version, self.transitions = self._version + 1, transitions
        return True

    def _write(self, record: LeaderElectionRecord, *, version: int, transitions: int) -> None:
        data = {
            "holder": record.holder_identity or "",
            "duration": int(record.lease_duration),
            "acquire_time": record.acquire_time,
            "renew_time": record.renew_time,
            "renewed_at": time.time(),
            "version": version,
            "transitions": transitions,
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data))
        temporary.replace(self.path)

    @contextlib.contextmanager
    def _locked(self) -> Any:
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class _NotFound:
    """What the library expects of a failed get when the record does not exist (a 404's body)."""

    body = json.dumps({"code": 404})
    reason = "not found"


class KubernetesLeaseLock(LeaseLock):  # type: ignore[misc]
    """kubernetes' Lease lock, counting the holder changes in `spec.leaseTransitions` (the term),
    which the library's lock leaves alone, and creating the Lease labelled with its job (`labels`:
    the admission policy lets only that job's pods write it) and owned by it (`owner`: the
    TrainingJob's name and uid; the garbage collector deletes the Lease with the job)."""

    def __init__(
        self,
        name: str,
        namespace: str,
        identity: str,
        labels: dict[str, str] | None = None,
        owner: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(name, namespace, identity)
        self.labels = dict(labels or {})
        self.owner = owner
        self.requests = RequestCount()

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        self.requests.add()
        return super().get(name, namespace)  # type: ignore[no-any-return]

    def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        self.requests.add()
        return bool(super().update(name, namespace, updated_record))

    def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        self.requests.add()
        owners = None
        if self.owner is not None:
            job, uid = self.owner
            owners = [
                client.V1OwnerReference(
                    api_version=protocol.TRAININGJOB_API_VERSION,
                    kind=protocol.TRAININGJOB_KIND,
                    name=job,
                    uid=uid,
                )
            ]
        metadata = client.V1ObjectMeta(name=name, labels=self.labels or None, owner_references=owners)
        body = client.V1Lease(metadata=metadata, spec=self.get_lease_spec(election_record))
        try:
            self.lease_reference = self.api_instance.create_namespaced_lease(namespace, body)
        except ApiException as error:  # e.g. another candidate created it first: read it next
            logging.getLogger(__name__).info("cannot create the lease: %s", error.reason)
            return False
        return True

    @property
    def transitions(self) -> int:
        spec = self.lease_reference.spec if self.lease_reference is not None else None
        return int(spec.lease_transitions or 0) if spec is not None else 0

    def get_lease_spec(self, leader_election_record: Any, current_spec: Any = None) -> Any:
        previous = current_spec.holder_identity if current_spec is not None else None
        transitions = int(current_spec.lease_transitions or 0) if current_spec is not None else 0
        spec = super().get_lease_spec(leader_election_record, current_spec)
        changed = previous is not None and previous != leader_election_record.holder_identity
        spec.lease_transitions = transitions + changed
        return spec


class Election:
    """One candidate's side of the election. `step()` is one round of the library's algorithm (read,
    then take or renew the lease if this candidate may); `leading()` says whether it may act now."""

    def __init__(self, lock: FileLeaseLock | KubernetesLeaseLock, timing: Timing) -> None:
        self.lock = lock
        self.timing = timing
        config = Config(lock, timing.duration, timing.renew_deadline, timing.retry, lambda: None, None)
        self._election = LeaderElection(config)
        self.renewed_at: float | None = None
        """Monotonic time of this candidate's last successful take or renewal."""
        self.term = 0
        """The term of this candidate's lease while it holds it."""
        self.taken_from: Lease | None = None
        """The lease as this candidate last saw it before its latest take or renewal (its holder: the
        leader this one replaces, when it just took the lease)."""
        self._mutex = threading.Lock()
        """One lease operation at a time (they run in threads and share the lock's last read)."""
        self._withdrawn = False
        """This candidate released the lease (its process is ending): it never takes it again."""
        self._renewer: threading.Thread | None = None
        self._stop_renewing = threading.Event()
        """Set to end the renewal thread (`keep_renewing`)."""

    @property
    def identity(self) -> str:
        return str(self.lock.identity)

    def renewing(self) -> bool:
        """Its renewal thread runs (`keep_renewing`): the lease is renewed without a campaign's step."""
        return self._renewer is not None and self._renewer.is_alive() and not self._stop_renewing.is_set()

    def keep_renewing(self) -> None:
        """While this candidate holds the lease, renew it `timing.renewals_per_retry` times a retry from
        a thread of its own, whatever the event loop is busy with: a leader of thousands of members may run
        late by a second at a burst of their reports, and renewals waiting on the loop would let
        the lease lapse under a leader that is working (fenced, the job handed over, for nothing).
        It ends when no renewal succeeded within the renew deadline (then `leading()` is False, and
        only a campaign may take the lease again), when its leader stands down (`stop_renewing`),
        or when the event loop that started it is closed (its process, or a test, is over)."""
        self._stop_renewing.set()  # a thread still running from an earlier term ends
        if self._renewer is not None:
            self._renewer.join()
        self._stop_renewing = threading.Event()
        loop = asyncio.get_running_loop()
        self._renewer = threading.Thread(
            target=self._renew_while_held, args=(self._stop_renewing, loop), name="lease-renewal", daemon=True
        )
        self._renewer.start()

    def _renewed(self, started: float) -> None:
        """A take or renewal begun at `started` (monotonic) succeeded. Two may overlap (a campaign's,
        its result taken in late by a busy event loop, and the renewal thread's): the later stands."""
        self.renewed_at = max(self.renewed_at or started, started)
        self.term = self.lock.transitions + 1

    def stop_renewing(self) -> None:
        """Its leader stands down: the lease is no longer renewed for it (it lapses, or is released)."""
        self._stop_renewing.set()

    def _renew_while_held(self, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        # Twice per retry locally: a renewal slowed by a busy process still lands within the deadline.
        while not stop.wait(self.timing.retry / self.timing.renewals_per_retry):
            if self._withdrawn or loop.is_closed() or not self.leading():
                return  # given up, or over, or the deadline passed: only a campaign takes it now
            started = time.monotonic()
            try:
                held = self._take_or_renew()
            except Exception:  # the API server unreachable for a moment: tried again until the deadline
                held = False
            if held:
                self._renewed(started)

    async def step(self) -> bool:
        """True: this candidate holds the lease now (taken or renewed)."""
        started = time.monotonic()
        held = await asyncio.to_thread(self._take_or_renew)
        if held:
            self._renewed(started)
        return bool(held)

    def _take_or_renew(self) -> bool:
        with self._mutex:
            return False if self._withdrawn else self._take_or_renew_now()

    def _take_or_renew_now(self) -> bool:
        election = self._election
        prior = election.observed_record, election.observed_time_milliseconds
        held = bool(election.try_acquire_or_renew())
        observed = election.observed_record
        if not held and observed is not None and (observed.holder_identity or "").startswith(RELEASED):
            # client-go takes a lease nobody holds at once; this library would wait out its duration.
            prior = observed, election.observed_time_milliseconds
            election.observed_time_milliseconds = 0
            held = bool(election.try_acquire_or_renew())
        if held:
            record, observed_ms = prior
            self.taken_from = None
            if record is not None:
                # A released lease says when its holder last led; otherwise: when it was seen unrenewed.
                identity = record.holder_identity or ""
                last = _record_time(record.renew_time) if identity.startswith(RELEASED) else None
                self.taken_from = Lease.of(identity, self.lock.transitions, last or observed_ms / 1000)
        return held

    async def release(self) -> None:
        """Give the lease up (this leader's process is ending): the next candidate takes it at once
        instead of after its duration (client-go's ReleaseOnCancel)."""
        leading = self.leading()
        self.renewed_at = None
        await asyncio.to_thread(self._withdraw, leading)

    def _withdraw(self, leading: bool) -> None:
        """Out of the race for good (a step in flight ends first); the lease released if it held it."""
        with self._mutex:
            self._withdrawn = True
            if leading:
                with contextlib.suppress(Exception):  # best effort: the lease expires anyway
                    # Read first: the compare-and-swap is against the lease as it is now (the
                    # library's Lease lock keeps the version of its last read, not of its last write).
                    found, record = self.lock.get(self.lock.name, self.lock.namespace)
                    if found and record.holder_identity == self.identity:
                        self._write_released(self.identity)

    async def release_predecessor(self, own: Holder) -> Lease | None:
        """This supervisor was started again on its machine: if the lease's holder is its predecessor
        (the same machine and host, another incarnation), that process is dead; release its lease.
        Returns the lease released (None: the lease names someone else, or changed meanwhile)."""
        return await asyncio.to_thread(self._release_predecessor, own)

    def _release_predecessor(self, own: Holder) -> Lease | None:
        with self._mutex:
            found, record = self.lock.get(self.lock.name, self.lock.namespace)
            if not found:
                return None
            lease = Lease.of(record.holder_identity, self.lock.transitions + 1, time.time())
            holder = lease.leader
            if holder is None or (holder.machine, holder.host) != (own.machine, own.host):
                return None
            if holder.incarnation == own.incarnation:
                return None
            # The record keeps the predecessor's last renewal: the job was leaderless from then on.
            return lease if self._write_released(holder.identity(), record.renew_time) else None

    def _write_released(self, identity: str, renewed: str | None = None) -> bool:
        """The lease's holder `identity` marked released (a compare-and-swap on the last read)."""
        now = str(datetime.datetime.now())
        released = LeaderElectionRecord(RELEASED + identity, "1", now, renewed or now)
        return bool(self.lock.update(self.lock.name, self.lock.namespace, released))

    def leading(self, now: Callable[[], float] = time.monotonic) -> bool:
        """Sure to hold the lease still: renewed within the renew deadline (checked before acting)."""
        return self.renewed_at is not None and now() - self.renewed_at < self.timing.renew_deadline

    def observed(self) -> Lease | None:
        """The lease as last read (None: not read yet, or nobody holds it)."""
        record = self._election.observed_record
        if record is None:
            return None
        observed_at = self._election.observed_time_milliseconds / 1000
        return Lease.of(record.holder_identity, self.lock.transitions + 1, observed_at)

    async def read(self) -> Lease | None:
        """Read the lease without taking it (a member finding its leader, a watcher)."""
        found, record = await asyncio.to_thread(self.lock.get, self.lock.name, self.lock.namespace)
        if not found:
            return None
        return Lease.of(record.holder_identity, self.lock.transitions + 1, time.time())


def _record_time(text: Any) -> float | None:
    """A lease record's time (the library writes local, naive `str(datetime)`), as Unix seconds."""
    try:
        return datetime.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


LEASE_FILE = "leader-lease.json"
"""Locally: the job's lease, in the run directory."""


def local_election(run_dir: Path, holder: Holder) -> Election:
    return Election(FileLeaseLock(run_dir / LEASE_FILE, holder.identity()), LOCAL_TIMING)


def read_lease_file(path: Path) -> Lease | None:
    """Locally: the lease as it stands (a watcher finding the leader); None before the first leader."""
    lock = FileLeaseLock(path, "watcher")
    found, record = lock.get(lock.name, lock.namespace)
    if not found:
        return None
    return Lease.of(record.holder_identity, lock.transitions + 1, time.time())


def cluster_election(
    lease_name: str, namespace: str, holder: Holder, job: str, job_uid: str | None = None
) -> Election:
    """In a pod: the supervisor's client (supervisor/pod/own_pod.py: the pod's service account, or
    KUBECONFIG as the fake kubelet's pods have it; rate limit and retries); the Lease owned by the job
    when its uid is known."""
    from kubernetes import client
    from slicekeeper.supervisor.pod.own_pod import pod_api_client

    owner = (job, job_uid) if job_uid else None
    lock = KubernetesLeaseLock(lease_name, namespace, holder.identity(), {protocol.LABEL_JOB: job}, owner)
    lock.api_instance = client.CoordinationV1Api(pod_api_client())
    return Election(lock, CLUSTER_TIMING)

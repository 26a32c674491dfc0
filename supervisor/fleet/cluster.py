"""The cluster under a simulated job: which slices train, the spares standing by, the machines and
slices that come back and when, the host whose supervisor leads, and the worlds the job has run.

What the fleet simulator's run (supervisor.fleet.simulation) changes as failures come and its policy
decides; the job's time and its accounting are supervisor.fleet.training's.
"""

from __future__ import annotations

from slicekeeper.supervisor.fleet.outcome import Job


class Cluster:
    def __init__(self, job: Job) -> None:
        self.shape = job.shape
        self.active = set(range(job.shape.slices))
        """The slices that train (a scale-down drops some, a scale-up brings one back)."""
        self.spares = job.spares
        self.spare_returns: list[float] = []
        """When each spare handed to a lost host comes back as a new machine, in time order."""
        self.slice_returns: list[float] = []
        """When each dropped slice's machines come back, in time order."""
        self.leader = 0
        """The host whose supervisor leads: losing its machine is detected when its lease runs out."""
        self.worlds_run = {tuple(sorted(self.active))}
        """The sets of slices the job has run on: a world's first start compiles its program."""
        self._hosts_of_world: tuple[tuple[int, ...], tuple[int, ...], frozenset[int]] = ((), (), frozenset())

    def world_hosts(self) -> tuple[int, ...]:
        """The hosts of the active slices (kept while they stay the same: 25,000 of them)."""
        key = tuple(sorted(self.active))
        if self._hosts_of_world[0] != key:
            hosts = self.shape.hosts_in(key)
            self._hosts_of_world = (key, hosts, frozenset(hosts))
        return self._hosts_of_world[1]

    def live(self) -> frozenset[int]:
        """The same hosts as a set: every one of them is connected (a lost one is replaced at once)."""
        self.world_hosts()
        return self._hosts_of_world[2]

    def active_chips(self) -> int:
        return len(self.active) * self.shape.hosts_per_slice * self.shape.devices_per_host

    def hosts_hit(self, host: int, *, whole_slice: bool) -> list[int]:
        """The hosts a failure of `host` takes down: its slice's, or only its own."""
        per = self.shape.hosts_per_slice
        if whole_slice:
            first = host // per * per
            return list(range(first, first + per))
        return [host]

    def leader_lost(self, hit: list[int]) -> None:
        """The leader's machine is gone with `hit`: another host of the world leads."""
        self.leader = min((h for h in self.world_hosts() if h not in hit), default=self.leader)

    def first_run(self) -> bool:
        """Whether the active slices make a world the job has not run on before (now it has)."""
        key = tuple(sorted(self.active))
        first_time = key not in self.worlds_run
        self.worlds_run.add(key)
        return first_time

    def spares_back(self, now: float) -> None:
        """The spares whose new machines have come by `now` stand by again."""
        while self.spare_returns and self.spare_returns[0] <= now:
            self.spare_returns.pop(0)
            self.spares += 1

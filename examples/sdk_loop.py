"""A training loop of your own under the slicekeeper supervisor: the SDK calls and nothing else.

The "model" is a numpy vector updated from data that is a pure function of (seed, step), so a
restored run ends with exactly the parameters of an uninterrupted one, and every host computes the
same vector: the fingerprint is the same whatever the number of hosts taking part (a scaled-down
job included). Each host also keeps a shard of its own, as the hosts of a slice each keep their part
of a sharded state: updated from data of its own (a function of the step and the host's place in its
slice, so a host and its twins on the other slices keep the same shard) and checkpointed with the
rest. A restore that hands a host another host's shard, or none, leaves a shard that is not its own
at the end: the host then reports another fingerprint, and the run no longer matches a fault-free
one. Run it as the workload of a TrainingJob
(`spec.workload.command: ["python", "examples/sdk_loop.py"]`) or alone to try it.
"""

import hashlib
import sys
import time

import numpy as np
import slicekeeper.workload as sk
from slicekeeper.workload.checkpointing import Checkpointer

SEED, SIZE, STEP_SECONDS = 0, 64, 0.05

session = sk.connect()  # reads the identity the supervisor put in the environment
checkpointer = Checkpointer(session)  # the local tier, interval and retention from the TrainingJob
worker = session.identity.host % session.identity.hosts_per_slice  # this host's place in its slice


def updated(params: np.ndarray, step: int) -> np.ndarray:
    return 0.9 * params + 0.1 * np.random.default_rng([SEED, step]).normal(size=SIZE)


def updated_shard(shard: np.ndarray, step: int) -> np.ndarray:
    return 0.5 * shard + np.random.default_rng([SEED, step, 1 + worker]).normal(size=SIZE)


restored = checkpointer.restore(session.identity.restore_step)  # the step every host agreed on
if restored is None:
    with session.phase(sk.Phase.TRAINING_PREP):
        params, shard, first = np.zeros(SIZE), np.zeros(SIZE), 1
else:
    params, shard, first = restored["params"], restored["shard"], session.identity.restore_step + 1

for step in range(first, session.total_steps + 1):
    with session.step(step) as record:  # the supervisor times this and watches for hangs
        params, shard = updated(params, step), updated_shard(shard, step)
        # The real work of a step, simulated in 5 ms slices: like computing, it advances only while
        # the process runs (a stopped or throttled process falls behind, as a slow chip would).
        for _ in range(round(STEP_SECONDS / 0.005)):
            time.sleep(0.005)
        # This loop's hosts never wait for each other, so all of the step is the host's own work;
        # a data-parallel loop marks this before its all-reduce (straggler scores use it).
        record.work_done()
        record.loss = float(np.mean(params**2))
    checkpointer.maybe_save(
        step, lambda params=params, shard=shard: {"params": params.copy(), "shard": shard.copy()}
    )

with session.phase(sk.Phase.TEARDOWN):
    checkpointer.close()  # waits for the last write
    own = np.zeros(SIZE)
    for step in range(1, session.total_steps + 1):
        own = updated_shard(own, step)  # what this host's shard is after an uninterrupted run
fingerprint = hashlib.sha256(params.tobytes()).hexdigest()
if not np.array_equal(shard, own):
    print(f"sdk_loop: host {session.identity.host}'s shard is not its own: a wrong restore", file=sys.stderr)
    fingerprint = hashlib.sha256(params.tobytes() + shard.tobytes()).hexdigest()
session.done(session.total_steps, fingerprint)

"""A training loop of your own under the slicekeeper supervisor: the SDK calls and nothing else.

The "model" is a numpy vector updated from data that is a pure function of (seed, step), so a
restored run ends with exactly the parameters of an uninterrupted one, and every host computes the
same vector: the fingerprint is the same whatever the number of hosts taking part (a scaled-down
job included). Run it as the workload of a TrainingJob
(`spec.workload.command: ["python", "examples/sdk_loop.py"]`) or alone to try it.
"""

import hashlib
import time

import numpy as np
import slicekeeper.workload as sk
from slicekeeper.workload.checkpointing import Checkpointer

SEED, SIZE, STEP_SECONDS = 0, 64, 0.05

session = sk.connect()  # reads the identity the supervisor put in the environment
checkpointer = Checkpointer(session)  # the local tier, interval and retention from the TrainingJob

restored = checkpointer.restore(session.identity.restore_step)  # the step every host agreed on
if restored is None:
    with session.phase(sk.Phase.TRAINING_PREP):
        params, first = np.zeros(SIZE), 1
else:
    params, first = restored["params"], session.identity.restore_step + 1

for step in range(first, session.total_steps + 1):
    with session.step(step) as record:  # the supervisor times this and watches for hangs
        batch = np.random.default_rng([SEED, step]).normal(size=SIZE)
        params = 0.9 * params + 0.1 * batch
        # The real work of a step, simulated in 5 ms slices: like computing, it advances only while
        # the process runs (a stopped or throttled process falls behind, as a slow chip would).
        for _ in range(round(STEP_SECONDS / 0.005)):
            time.sleep(0.005)
        # This loop's hosts never wait for each other, so all of the step is the host's own work;
        # a data-parallel loop marks this before its all-reduce (straggler scores use it).
        record.work_done()
        record.loss = float(np.mean(params**2))
    checkpointer.maybe_save(step, lambda params=params: {"params": params.copy()})

with session.phase(sk.Phase.TEARDOWN):
    checkpointer.close()  # waits for the last write
session.done(session.total_steps, hashlib.sha256(params.tobytes()).hexdigest())

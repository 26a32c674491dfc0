"""The workload SDK: the few calls a training loop makes so its supervisor can keep it alive.

    import slicekeeper.workload as sk

    session = sk.connect()
    with session.phase(sk.Phase.TPU_INITIALIZATION):
        jax.distributed.initialize(**session.jax_distributed_args())
    for step in range(first, session.total_steps + 1):
        with session.step(step) as record:
            grads = local_gradients(...)  # this host's own work, blocked on
            record.work_done()  # from here on: waiting for the other hosts
            record.loss = all_reduce_and_update(grads)
    session.done(session.total_steps, fingerprint)

Stdlib only: importing it costs nothing; checkpointing of JAX state lives in
`slicekeeper.workload.jax_checkpoint` and is imported only by JAX trainers.
"""

from slicekeeper.workload.sdk import HostIdentity, Session, StepRecord, WorkClock, connect

from slicekeeper.protocol import Phase

__all__ = ["HostIdentity", "Phase", "Session", "StepRecord", "WorkClock", "connect"]

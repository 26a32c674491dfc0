"""The workload SDK: the few calls a training loop makes so its supervisor can keep it alive.

    import slicekeeper.workload as sk

    session = sk.connect()
    with session.phase(sk.Phase.TPU_INITIALIZATION):
        jax.distributed.initialize(**session.jax_distributed_args())
    for step in range(session.first_step(restored), session.total_steps):
        with session.step(step) as record:
            record.loss = train_step(...)
    session.done(fingerprint)

Stdlib only: importing it costs nothing; checkpointing of JAX state lives in
`slicekeeper.workload.jax_checkpoint` and is imported only by JAX trainers.
"""

from slicekeeper.workload.sdk import HostIdentity, Session, StepRecord, connect

from slicekeeper.protocol import Phase

__all__ = ["HostIdentity", "Phase", "Session", "StepRecord", "connect"]

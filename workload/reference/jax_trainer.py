"""The reference JAX workload: one process per TPU host, the tiny LM trained like a multislice job.

Run by the supervisor (`spec.workload.command` default). Uses only the public SDK, so it doubles as
the example of a user's loop: phases reported, every step bracketed and blocked on, each host's
shards saved to the local tier (the supervisor copies them to the peer and persistent tiers), the
agreed step restored on restart, its compiled programs kept (workload/compiled_programs.py) so that
a restarted process loads them instead of compiling.

The state is split over the hosts of a slice and replicated over slices (model.py says how), so a
host's checkpoint holds only its own shard. Elastic: the JAX world is the hosts of this generation
(`num_hosts`, rank `process_id`), whole slices, which after a scale-down are fewer than the job's;
the global batch stays sized for the full job (`full_hosts`) and each host accumulates the chunks
of the missing ones (model.ChunkPlan). Each step marks where this host's own work ends
(`record.work_done()`) before the cross-host reduction. A job with `spec.workload.initFrom` starts,
until it has a checkpoint of its own, from that orbax checkpoint's state and step, resharded onto
its mesh.

At the end every host's own shards are compared with its twins' in the other slices: replicas that
no longer agree (a wrong shard restored somewhere) turn the fingerprint into `diverged:...`, which
can never equal a fault-free run's.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import jax
import numpy as np
import slicekeeper.workload as sk
from slicekeeper.workload import orbax_format
from slicekeeper.workload.collective_transport import TransportThreads
from slicekeeper.workload.compiled_programs import ProgramCache
from slicekeeper.workload.jax_checkpoint import (
    JaxCheckpointer,
    fingerprint_gathered,
    local_copy,
    replica_agreement,
)
from slicekeeper.workload.reference.batches import model_config, trainer_arguments
from slicekeeper.workload.reference.model import ShardedModel, host_mesh


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return trainer_arguments(
        "slicekeeper.workload.reference.jax_trainer",
        final_params="after training, process 0 writes the final parameters here (.npz, keys = leaf paths)",
    ).parse_args(argv)


def configure_jax() -> None:
    if os.environ.get("JAX_PLATFORMS") == "cpu":
        # Cross-process collectives on CPU devices (the TPU stand-in) go over gloo.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # No `--xla_backend_optimization_level=0` any more (it halved the other hosts' compiles
        # when every restart compiled): each host now loads the programs it compiled before
        # (workload/compiled_programs.py), and executables compiled at that level cannot be
        # loaded back ("Function wrapped_copy not found").
    # No `jax_compilation_cache_dir`: it served process 0 only, and an executable it serves cannot be
    # stored whole by ProgramCache, which serves every process (workload/compiled_programs.py).


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    session = sk.connect()
    identity = session.identity
    config = model_config(args)

    with session.phase(sk.Phase.TPU_INITIALIZATION):
        configure_jax()
        jax.distributed.initialize(**session.jax_distributed_args())

    with session.phase(sk.Phase.TRAINING_PREP):
        transport = TransportThreads()  # before the CPU client starts gloo's event loop
        # This generation's slices x the hosts of a slice x a host's devices; the batch stays the
        # full job's.
        mesh = host_mesh(jax.devices(), identity.hosts_per_slice)
        model = ShardedModel(config, mesh, full_hosts=identity.full_hosts)
        checkpointer = JaxCheckpointer(session)
        # Every program this process compiles is kept: a restart, or the next run of the same job,
        # loads it instead of compiling (workload/compiled_programs.py).
        programs = ProgramCache(identity.compilation_cache)
    state = checkpointer.restore(identity.restore_step, model.abstract_state())
    if state is not None:
        first = (identity.restore_step or 0) + 1
    elif identity.init_from:  # no checkpoint of its own yet: start where the given one ends
        with session.phase(sk.Phase.CHECKPOINT_RESTORE):
            state, step = orbax_format.restore_onto(identity.init_from, model.abstract_state())
            jax.block_until_ready(state)
        first = step + 1
    else:
        with session.phase(sk.Phase.TRAINING_PREP):
            state = model.init_state(args.seed, programs)
        first = 1

    with session.phase(sk.Phase.PROGRAM_STARTUP):
        model.compile(programs)
        session.programs(
            loaded=programs.loaded, compiled=programs.compiled, backend_compiled=programs.backend_compiled
        )
        params = model.gather(state["params"])  # what this host computes on: gathered over its slice
        if jax.default_backend() == "cpu":
            transport.quiet()  # gloo's event loop gets idle cycles only (workload/collective_transport.py)

    # CPU devices (the local stand-in) share the machine's cores with the other hosts: time own work
    # in CPU seconds, which the other hosts' turns on the cores do not stretch (sk.WorkClock).
    clock = sk.WorkClock.CPU if jax.default_backend() == "cpu" else sk.WorkClock.WALL
    for step in range(first, identity.total_steps + 1):
        with session.step(step, clock=clock) as record:
            local = model.local_grads(params, model.global_batch(args.seed, step))  # blocks
            record.work_done()  # what follows is the reduction: waiting for the slowest host
            state, params, record.loss = model.apply(state, local)
        checkpointer.maybe_save(step, state)

    with session.phase(sk.Phase.TEARDOWN):
        checkpointer.close()  # waits for the last write
        # The last step's gathered parameters are whole on every host: no collective, nothing to
        # compile (each slice's copy is compared with the others' just below).
        final: dict[str, Any] = local_copy(params)
        params_fingerprint = fingerprint_gathered(final)
        agreement = replica_agreement(state, identity.hosts_per_slice)  # a collective too
        if agreement.diverged:
            slices = ",".join(map(str, agreement.diverged))
            print(
                f"slicekeeper reference trainer: the state of slice(s) {slices} differs from slice 0's: "
                "a wrong shard was restored somewhere",
                file=sys.stderr,
                flush=True,
            )
            params_fingerprint = f"diverged:{slices}:{agreement.digest}"  # the same on every host
        if args.final_params is not None and jax.process_index() == 0:
            with args.final_params.open("wb") as file:  # a file object: savez adds no suffix
                np.savez(file, **final)
    session.done(identity.total_steps, params_fingerprint)
    jax.distributed.shutdown()
    session.close()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is saved and reported: skip the interpreter's teardown of JAX's runtime (0.4 s of a
    # job's end on every host, measured here).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

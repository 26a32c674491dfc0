"""The reference PyTorch workload: one process per TPU host, the tiny LM trained like a multislice job.

The JAX trainer's twin (jax_trainer.py), for the PyTorch users: the same model, data and layout
(torch_sharded.py), the same public SDK (phases, every step bracketed, this host's shards saved to the
local tier through the SDK's Checkpointer, so the peer and persistent tiers and every restore work
unchanged), and the same end: every host's rows compared with its twins', the parameters'
fingerprint reported. A job with `spec.workload.initFrom` starts, until it has a checkpoint of its
own, from that torch.distributed.checkpoint's state and step, read onto this job's mesh.

The world is this generation's hosts (`num_hosts`, rank `process_id`), joined with torch.distributed
at the coordinator the supervisor names for the generation (rank 0 serves the TCP store there, as
JAX's process 0 serves its coordinator). Here its tensors live on the CPU and its collectives go over
gloo. On a TPU host (`PJRT_DEVICE=TPU`, as GKE's TPU images set it) it trains on the XLA device with
torch_xla: the `xla` process group (its world from the TPU runtime's environment, which the
supervisor sets per generation), the mesh's device type `xla`, each step's graph executed at its
end (`torch_xla.sync()`). That path is written but was never run: there is no TPU here and no
torch_xla wheel for this torch (docs/workload-sdk.md says what that leaves untested).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np
import slicekeeper.workload as sk
import torch
import torch.distributed as dist
from slicekeeper.workload.checkpointing import Checkpointer
from slicekeeper.workload.collective_transport import TransportThreads
from slicekeeper.workload.reference.batches import model_config, trainer_arguments
from slicekeeper.workload.reference.torch_sharded import ShardedTorchModel, TrainState, host_mesh

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
"""Longer than any hang detection: the supervisor, not gloo, decides when a step is stuck."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return trainer_arguments(
        "slicekeeper.workload.reference.torch_trainer",
        final_params="after training, rank 0 writes the final parameters here (.npz, keys = parameter names)",
    ).parse_args(argv)


def xla_runtime() -> ModuleType | None:
    """torch_xla, when this host trains on a TPU (`PJRT_DEVICE=TPU`); None on the CPU.

    On a TPU host without torch_xla the trainer stops with the reason, rather than train on the CPU."""
    if os.environ.get("PJRT_DEVICE", "").upper() != "TPU":
        return None
    try:
        import torch_xla
        import torch_xla.distributed.xla_backend  # registers the `xla` process-group backend
    except ImportError as error:
        raise SystemExit(
            f"slicekeeper torch trainer: PJRT_DEVICE=TPU, but torch_xla cannot be imported ({error}); "
            f"install the torch_xla release matching torch {torch.__version__}, or unset PJRT_DEVICE to "
            "train on the CPU"
        ) from None
    runtime: ModuleType = torch_xla
    return runtime


def init_distributed(session: sk.Session, xla: ModuleType | None) -> torch.device:
    """Join this generation's world; the device the tensors live on."""
    if xla is not None:
        # The TPU runtime knows the world (worker id and hostnames, slices): PJRT's rendezvous.
        dist.init_process_group("xla", init_method="xla://", timeout=COLLECTIVE_TIMEOUT)
        return torch.device(xla.device())
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT, **session.torch_distributed_args())
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per host, and a reduction order that never changes
    session = sk.connect()
    identity = session.identity
    config = model_config(args)

    xla = xla_runtime()
    with session.phase(sk.Phase.TPU_INITIALIZATION):
        transport = TransportThreads()  # before gloo starts its event loops
        device = init_distributed(session, xla)

    with session.phase(sk.Phase.TRAINING_PREP):
        mesh = host_mesh(identity.hosts_per_slice, device.type)
        model = ShardedTorchModel(config, mesh, full_hosts=identity.full_hosts, device=device)
        checkpointer = Checkpointer(session, layout=model.layout())
    shards = checkpointer.restore(identity.restore_step)
    state: TrainState
    if shards is not None:
        state = model.from_host_shards(shards)
        first = (identity.restore_step or 0) + 1
    elif identity.init_from:  # no checkpoint of its own yet: start where the given one ends
        with session.phase(sk.Phase.CHECKPOINT_RESTORE):
            state, step = model.load_exported(identity.init_from)
        first = step + 1
    else:
        with session.phase(sk.Phase.TRAINING_PREP):
            state = model.init_state(args.seed)
        first = 1

    with session.phase(sk.Phase.PROGRAM_STARTUP):
        params = model.gather(state.shard)  # what this host computes on: gathered over its slice
        if xla is None:
            transport.quiet()  # gloo's event loops get idle cycles only (workload/collective_transport.py)

    for step in range(first, identity.total_steps + 1):
        with session.step(step, clock=sk.WorkClock.CPU) as record:
            local = model.local_grads(params, args.seed, step)
            record.work_done()  # what follows is the reduction: waiting for the slowest host
            state, params, record.loss = model.apply(state, local)
            if xla is not None:
                xla.sync()  # run the step's graph now: the step ends when its work does
        checkpointer.maybe_save(step, functools.partial(model.host_shards, state))

    with session.phase(sk.Phase.TEARDOWN):
        checkpointer.close()  # waits for the last write
        fingerprint = model.fingerprint(params)
        diverged, digest = model.replica_agreement(state)  # a collective too
        if diverged:
            slices = ",".join(map(str, diverged))
            print(
                f"slicekeeper torch trainer: the state of slice(s) {slices} differs from slice 0's: "
                "a wrong shard was restored somewhere",
                file=sys.stderr,
                flush=True,
            )
            fingerprint = f"diverged:{slices}:{digest}"  # the same on every host
        if args.final_params is not None and dist.get_rank() == 0:
            with args.final_params.open("wb") as file:
                final: dict[str, Any] = {name: value.cpu().numpy() for name, value in params.items()}
                np.savez(file, **final)
    session.done(identity.total_steps, fingerprint)
    session.close()
    # Everything is saved and reported. Leave now: gloo's threads can abort a process at interpreter
    # exit when a peer closed its sockets first ("terminate called without an active exception",
    # SIGABRT, seen once in ten runs on the spare that took a host over), which the supervisor would
    # rightly count as a crash of a finished job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

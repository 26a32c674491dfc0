"""A PyTorch data-parallel loop of your own under the slicekeeper supervisor.

An ordinary DistributedDataParallel loop (a small MLP regressing a fixed random function of its
input, data a pure function of (seed, step)); what the supervisor needs is the handful of lines marked
`# slicekeeper`: connect, join the generation's world, restore the agreed step, bracket each step,
save every few steps, say the run is done. A restored run of the same world size ends with exactly
the parameters of an uninterrupted one (its samples are indexed by rank and world size: a job scaled
down to fewer hosts trains on other samples). Run it as the workload of a TrainingJob
(`spec.workload.command: ["python", "examples/sdk_torch_loop.py"]`, the `torch` extra installed).
"""

import hashlib

import slicekeeper.workload as sk
import torch
import torch.distributed as dist
from slicekeeper.workload.checkpointing import Checkpointer
from slicekeeper.workload.torch_checkpoint import load_state_shards, state_shards
from slicekeeper.workload.torch_ddp import add_in_rank_order
from torch.nn.parallel import DistributedDataParallel

SEED, BATCH, WIDTH = 0, 32, 64

torch.set_num_threads(1)
session = sk.connect()  # slicekeeper: the identity the supervisor put in the environment
with session.phase(sk.Phase.TPU_INITIALIZATION):
    dist.init_process_group("gloo", **session.torch_distributed_args())  # slicekeeper: the world
checkpointer = Checkpointer(session)  # slicekeeper: the local tier, interval and retention

torch.manual_seed(SEED)
model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
target = torch.nn.Linear(WIDTH, 1)  # the function to learn, the same on every host (seeded)

restored = checkpointer.restore(session.identity.restore_step)  # slicekeeper: the step every host agreed on
first = 1
if restored is not None:
    load_state_shards(restored, model, optimizer)  # slicekeeper: weights and optimizer state of that step
    first = session.identity.restore_step + 1
ddp = DistributedDataParallel(model)
ddp.register_comm_hook(None, add_in_rank_order)  # slicekeeper: the same sums after a restart

for step in range(first, session.total_steps + 1):
    with session.step(step, clock=sk.WorkClock.CPU) as record:  # slicekeeper: timed, watched for hangs
        sample = SEED * 1_000_003 + step * dist.get_world_size() + dist.get_rank()  # (seed, step, rank)
        generator = torch.Generator().manual_seed(sample)
        inputs = torch.randn(BATCH, WIDTH, generator=generator)
        with torch.no_grad():
            labels = target(inputs)
        loss = torch.nn.functional.mse_loss(ddp(inputs), labels)
        record.work_done()  # slicekeeper: own work ends here (the all-reduce follows in backward)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over every host
        optimizer.step()
        record.loss = float(loss)
    checkpointer.maybe_save(step, lambda: state_shards(model, optimizer))  # slicekeeper: all of it

checkpointer.close()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
session.done(session.total_steps, digest)  # slicekeeper
dist.destroy_process_group()

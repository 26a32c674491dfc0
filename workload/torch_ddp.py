"""A DistributedDataParallel communication hook whose sums do not depend on DDP's bucket layout.

gloo's ring all-reduce adds each gradient element over the hosts in an order set by where the element
sits in DDP's bucket buffer, and DDP lays its buckets out anew after its first iteration (in the
order gradients became ready). A process restarted from a checkpoint runs its first step with the
initial layout while an uninterrupted run is long past it, so the same step's gradients are added in
another order: the parameters differ in their last bits (measured: a third of the elements of a
4-host all-reduce change when the buffer is permuted), and so does the fingerprint a restarted run
must share with a fault-free one. With this hook every element is summed over the hosts in rank order,
wherever DDP puts it. It all-gathers instead of all-reducing: the world size times the gradient's
memory for a moment, nothing for a small model, too much for a large one (which would accept
float-close instead).

No `from __future__ import annotations` here: DDP checks the hook's annotations against the real
`GradBucket` and `Future[Tensor]` objects, which postponed (string) annotations are not.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # torch.distributed.GradBucket (mypy cannot see it there)


def add_in_rank_order(_: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook (`ddp.register_comm_hook(None, add_in_rank_order)`): the mean over the hosts of
    the bucket's gradients, each element added in rank order."""
    grads = bucket.buffer()
    world = dist.get_world_size()
    gathered = torch.empty(world * grads.numel(), dtype=grads.dtype, device=grads.device)
    dist.all_gather_single(gathered, grads.contiguous())
    every = gathered.view(world, -1)
    total = every[0].clone()
    for rank in range(1, world):
        total += every[rank]
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result((total / world).view_as(grads))
    return future

"""The PyTorch reference model laid out like a multislice job: a (replica, fsdp) DeviceMesh of hosts.

The layout is the JAX trainer's (model.py): the slices of this generation are data-parallel
replicas (`replica`), and every parameter and its optimizer moments are split by rows over the hosts
of a slice (`fsdp`), so a host holds only its own rows, shared with nobody but its twins (the same
worker in the other slices). A step is the same two phases:

- `local_grads`: the parameters gathered over the slice (FSDP's all-gather over `fsdp`), then this
  host's own chunks of the global batch, each chunk's gradient kept apart. No cross-host
  communication: the end of this phase is the end of the host's own work.
- `apply`: every host's chunk gradients gathered over the whole generation and summed in chunk
  order, each host updating its own rows with AdamW.

Summing in chunk order is what a reduce-scatter does not promise: floating-point addition depends on
its order, and a reduce over 2 hosts of 2 chunks each adds in another order than one over 4 hosts of
1 chunk. Here every chunk's gradient is computed alone on the same parameters, and every host adds
the same chunks in the same order, so the parameters after a step are bit for bit the same in any
world size: a job scaled down and back up ends with the fault-free run's fingerprint. It costs an
all-gather of every chunk's gradient instead of a reduce-scatter, which is nothing for this model
and would be too much for a large one (a large job would use FSDP2's reduce-scatter and give up the
bitwise guarantee across world sizes, keeping it across restarts of the same size).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from slicekeeper.workload.local_tier import Shards
from slicekeeper.workload.reference.batches import ChunkPlan, ModelConfig, synthetic_batch
from slicekeeper.workload.reference.torch_model import (
    AdamWShard,
    Params,
    clip_factor,
    init_params,
    loss_and_grads,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from slicekeeper.shard_folder import Layout, LeafLayout

AXES = ("replica", "fsdp")
LEAF_PATHS = {"param": "model/", "mu": "optim/mu/", "nu": "optim/nu/"}
"""Where each kind of leaf lives in an exported checkpoint (a parameter's name follows)."""
COUNT_PATH = "optim/count"


class MissingShard(LookupError):
    """The checkpoint has no shard at a position this host's rows need."""


@dataclass
class TrainState:
    """One host's part of the training state: its rows of every parameter and their moments."""

    shard: Params
    opt: AdamWShard


@dataclass(frozen=True)
class LocalGrads:
    """This host's chunks of one step: [micro_steps, parameters + 1], each row a chunk's flattened
    gradient followed by its loss (zeros for padding slots)."""

    slots: torch.Tensor


def host_mesh(hosts_per_slice: int, device_type: str = "cpu") -> DeviceMesh:
    """The (replica, fsdp) mesh over this generation's processes, ranked slice by slice (`device_type`:
    `cpu` here, `xla` on a TPU host)."""
    world = dist.get_world_size()
    if world % hosts_per_slice:
        raise ValueError(f"{world} hosts do not make whole slices of {hosts_per_slice} hosts")
    return init_device_mesh(device_type, (world // hosts_per_slice, hosts_per_slice), mesh_dim_names=AXES)


def _position_key(start: int, stop: int, shape: tuple[int, ...]) -> str:
    """A shard's position in the global array, as the JAX trainer names it (`0-64_0-192`)."""
    return "_".join([f"{start}-{stop}", *(f"0-{size}" for size in shape[1:])])


class ShardedTorchModel:
    """The model on a (replica, fsdp) mesh: each host's rows, the two phases of a step, checkpoint
    shards named by position, and the whole parameters for the fingerprint."""

    def __init__(
        self, config: ModelConfig, mesh: DeviceMesh, *, full_hosts: int, device: torch.device | None = None
    ) -> None:
        if mesh.mesh_dim_names != AXES:
            raise ValueError(f"the mesh's axes must be {AXES}, not {mesh.mesh_dim_names}")
        self.config = config
        self.mesh = mesh
        self.device = device or torch.device("cpu")
        """Where the tensors live: the CPU here, the TPU's XLA device with torch_xla."""
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.parts = mesh.size(1)
        self.position = mesh.get_local_rank("fsdp")
        self.plan = ChunkPlan(chunks=full_hosts, host_count=self.world)
        self.shapes = {name: tuple(value.shape) for name, value in init_params(config, 0).items()}
        for name, shape in self.shapes.items():
            if shape[0] % self.parts:
                raise ValueError(
                    f"parameter {name} {shape}: {shape[0]} rows do not split over the {self.parts} "
                    "hosts of a slice; choose a model size or job shape that divides"
                )
        self.rows = {
            name: (self.position * shape[0] // self.parts, (self.position + 1) * shape[0] // self.parts)
            for name, shape in self.shapes.items()
        }
        self.sizes = {name: int(np.prod(shape)) for name, shape in self.shapes.items()}

    # --- state ---------------------------------------------------------------------------------
    def init_state(self, seed: int) -> TrainState:
        full = init_params(self.config, seed)
        shard = {
            name: full[name][start:stop].clone().to(self.device) for name, (start, stop) in self.rows.items()
        }
        return TrainState(shard, AdamWShard.zeros_like(shard))

    def gather(self, shard: Params) -> Params:
        """This host's rows -> the whole parameters (an all-gather over the slice: every host of the
        slice must call it)."""
        flat = torch.cat([shard[name].reshape(-1) for name in self.shapes])
        # The all-gather a DTensor sharded over `fsdp` makes when made whole (`full_tensor()`), called
        # directly: a DTensor's first operation imports torch._dynamo, 0.5-0.8 s of every restart.
        whole = torch.empty(self.parts * flat.numel(), dtype=flat.dtype, device=flat.device)
        dist.all_gather_into_tensor(whole, flat, group=self.mesh.get_group("fsdp"))
        parts = whole.reshape(self.parts, -1)  # host p's rows of every parameter, in order
        params: Params = {}
        offset = 0
        for name, shape in self.shapes.items():
            rows = self.sizes[name] // self.parts
            params[name] = parts[:, offset : offset + rows].reshape(shape)
            offset += rows
        return params

    # --- a step --------------------------------------------------------------------------------
    def local_grads(self, params: Params, seed: int, step: int) -> LocalGrads:
        """Phase one: this host's chunks of the step's global batch, each chunk's gradient and loss
        on the whole parameters. No communication."""
        per_chunk = self.config.batch_per_host
        batch = synthetic_batch(self.config, seed, step, self.plan.chunks * per_chunk)
        rows = torch.from_numpy(batch).long().to(self.device)
        width = sum(self.sizes.values()) + 1
        slots = torch.zeros(self.plan.micro_steps, width, device=self.device)
        for micro_step in range(self.plan.micro_steps):
            chunk = self.plan.chunk_at(micro_step, self.rank)
            if chunk is None:
                continue  # padding: nothing to compute
            loss, grads = loss_and_grads(
                self.config, params, rows[chunk * per_chunk : (chunk + 1) * per_chunk]
            )
            slots[micro_step, :-1] = torch.cat([grads[name].reshape(-1) for name in self.shapes])
            slots[micro_step, -1] = loss
        return LocalGrads(slots)

    def apply(self, state: TrainState, local: LocalGrads) -> tuple[TrainState, Params, float]:
        """Phase two: every chunk's gradient from every host, summed in chunk order, averaged; each
        host updates its own rows; the new parameters gathered for the next step. Returns the new
        state, the whole parameters and the step's mean loss."""
        gathered = torch.empty(self.world * local.slots.shape[0], local.slots.shape[1], device=self.device)
        dist.all_gather_single(gathered, local.slots)  # host after host, along the first axis
        every = gathered.reshape(self.world, *local.slots.shape)
        total = torch.zeros(local.slots.shape[1], device=self.device)
        for chunk in range(self.plan.chunks):
            micro_step, host = self.plan.slot(chunk)
            total = total + every[host, micro_step]
        mean = total / self.plan.chunks
        grads = self._unflatten(mean[:-1])
        scale = clip_factor(grads)
        own = {name: grads[name][start:stop] * scale for name, (start, stop) in self.rows.items()}
        shard = state.opt.update(self.config, state.shard, own)
        fresh = TrainState(shard, state.opt)
        return fresh, self.gather(shard), float(mean[-1])

    def _unflatten(self, flat: torch.Tensor) -> Params:
        params: Params = {}
        offset = 0
        for name, shape in self.shapes.items():
            params[name] = flat[offset : offset + self.sizes[name]].reshape(shape)
            offset += self.sizes[name]
        return params

    # --- checkpoints ---------------------------------------------------------------------------
    def _leaves(self) -> list[tuple[str, str]]:
        """(leaf name, what it is) in checkpoint order: parameters, first moments, second moments."""
        return [(name, kind) for kind in ("param", "mu", "nu") for name in self.shapes]

    def layout(self) -> Layout:
        """What `host_shards`'s leaves are, for the manifests: `model/<name>`, `optim/mu/<name>`,
        `optim/nu/<name>` and `optim/count`, the keys of a `slicekeeper checkpoint export`."""
        leaves = [
            LeafLayout(f"leaf{number:04d}", LEAF_PATHS[kind] + name, self.shapes[name], "float32")
            for number, (name, kind) in enumerate(self._leaves())
        ]
        leaves.append(LeafLayout(f"leaf{len(leaves):04d}", COUNT_PATH, (), "int64"))
        return Layout("torch", tuple(leaves))

    def load_exported(self, location: str) -> tuple[TrainState, int]:
        """This host's rows and the step from a DCP checkpoint (`slicekeeper checkpoint export`'s, or
        any with the same keys), read as DTensors on this job's mesh: DCP reads each host's rows only,
        whatever world size wrote it. A collective: every host calls it."""
        # Imported here, for a start from an export only: with DTensor's operators they are half a
        # second of every process's imports, a standby's included.
        from slicekeeper.workload import dcp_format
        from torch.distributed.tensor import DTensor, Replicate, Shard

        shard = {
            name: torch.zeros(stop - start, *self.shapes[name][1:], device=self.device)
            for name, (start, stop) in self.rows.items()
        }
        state = TrainState(shard, AdamWShard.zeros_like(shard))
        sources = {"param": state.shard, "mu": state.opt.mu, "nu": state.opt.nu}
        count = torch.zeros((), dtype=torch.int64)
        tensors: dict[str, torch.Tensor] = {
            LEAF_PATHS[kind] + name: DTensor.from_local(
                sources[kind][name], self.mesh, [Replicate(), Shard(0)]
            )
            for name, kind in self._leaves()
        }
        tensors[COUNT_PATH] = count
        step = dcp_format.load_into(location, tensors)
        state.opt.count = int(count)
        return state, step

    def host_shards(self, state: TrainState) -> Shards:
        """{`leafNNNN/position`: numpy copy} of this host's rows, and `count` as a replicated scalar."""
        sources = {"param": state.shard, "mu": state.opt.mu, "nu": state.opt.nu}
        shards: Shards = {}
        for number, (name, kind) in enumerate(self._leaves()):
            start, stop = self.rows[name]
            shards[f"leaf{number:04d}/{_position_key(start, stop, self.shapes[name])}"] = (
                sources[kind][name].cpu().numpy().copy()
            )
        shards[f"leaf{len(self._leaves()):04d}/scalar"] = np.array(state.opt.count, np.int64)
        return shards

    def from_host_shards(self, shards: Mapping[str, np.ndarray]) -> TrainState:
        """This host's rows from its checkpoint shards (its own, or a twin's: the same names)."""

        def read(key: str) -> np.ndarray:
            if key not in shards:
                leaf = key.split("/")[0]
                held = sorted(name for name in shards if name.startswith(f"{leaf}/"))
                raise MissingShard(
                    f"no shard {key} in this host's checkpoint, which holds {held or 'nothing'} for that "
                    "leaf: was it saved with another model size or slice shape?"
                )
            return shards[key]

        values: dict[str, Params] = {"param": {}, "mu": {}, "nu": {}}
        for number, (name, kind) in enumerate(self._leaves()):
            start, stop = self.rows[name]
            values[kind][name] = torch.from_numpy(
                np.array(read(f"leaf{number:04d}/{_position_key(start, stop, self.shapes[name])}"))
            ).to(self.device)
        count = int(read(f"leaf{len(self._leaves()):04d}/scalar"))
        return TrainState(values["param"], AdamWShard(values["mu"], values["nu"], count))

    # --- the end of a run ----------------------------------------------------------------------
    def fingerprint(self, params: Params) -> str:
        """sha256 over every whole parameter's shape, dtype and bytes, in order (as the JAX trainer's)."""
        digest = hashlib.sha256()
        for name in self.shapes:
            whole = np.ascontiguousarray(params[name].cpu().numpy())
            digest.update(f"{whole.shape}{whole.dtype}".encode())
            digest.update(whole.tobytes())
        return digest.hexdigest()

    def replica_agreement(self, state: TrainState) -> tuple[tuple[int, ...], str]:
        """(slices whose rows differ from slice 0's, a digest of every host's rows in rank order): a
        collective over the generation. A gather of the parameters reads each slice's own copy, so a
        slice that restored a wrong shard would go unnoticed without it."""
        digest = hashlib.sha256()
        for name, shard in sorted(self.host_shards(state).items()):
            digest.update(f"{name}{shard.shape}{shard.dtype}".encode())
            digest.update(np.ascontiguousarray(shard).tobytes())
        mine = torch.frombuffer(bytearray(digest.digest()), dtype=torch.uint8).to(self.device)
        every = torch.empty(self.world * mine.numel(), dtype=torch.uint8, device=self.device)
        dist.all_gather_single(every, mine)
        slices = every.reshape(-1, self.parts, mine.numel())
        diverged = tuple(i for i in range(1, len(slices)) if not torch.equal(slices[i], slices[0]))
        return diverged, hashlib.sha256(every.cpu().numpy().tobytes()).hexdigest()

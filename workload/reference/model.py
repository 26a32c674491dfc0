"""A tiny decoder-only transformer language model (transformer.py), laid out like a multislice TPU job.

Small enough to train on CPU devices in a fraction of a second per step, real enough to exercise
what matters for resilience: the state is laid out on a (replica, fsdp, model) mesh, as production
jobs lay theirs out (MaxText's DCN data parallelism x ICI FSDP x tensor parallelism):

- `replica`: the slices taking part in this generation. Slices are data-parallel replicas, so the
  state is replicated over them; the job can drop a whole slice and take it back.
- `fsdp`: the hosts of a slice. Parameters and optimizer state are split over them, so each host's
  shard is unique within its slice and exists elsewhere only on its twins (the same worker in the
  other slices): a lost host's shard must come from its own disk, a peer copy or a twin.
- `model`: the devices of one host (Megatron-style attention heads and MLP columns).

A step is two programs so that the job can shrink and grow by whole slices without changing what it
trains on, and so that a host's own work is separate from its waiting for the others:
`local_grads` lets every host work through its share of a global batch sized for the full job
(accumulating over micro-steps when slices are missing) with no cross-host communication, on
parameters gathered over `fsdp` ahead of time; `apply` reduces the gradient sums over every host,
updates each host's own shard of the state, and gathers the new parameters for the next step (the
FSDP all-gather, prefetched). The boundary between them is where a host's own work ends and its
wait for the others begins, which is what the supervisor's straggler score measures.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from slicekeeper.workload.compiled_programs import ProgramCache
from slicekeeper.workload.reference import batches, transformer
from slicekeeper.workload.reference.batches import ChunkPlan, ModelConfig, synthetic_batch
from slicekeeper.workload.reference.transformer import Params, init_params, loss_fn, optimizer

_CODE_DIGEST = hashlib.sha256(
    b"".join(Path(path).read_bytes() for path in (__file__, batches.__file__, transformer.__file__))
).hexdigest()
"""The source of the modules that build the programs: a changed model compiles afresh."""

AXES = ("replica", "fsdp", "model")
"""The mesh's axes: slices of this generation, hosts of a slice, devices of a host."""
HOSTS = ("replica", "fsdp")
"""Every host of the generation: a host's rows of the batch and its gradient sums lie along these."""


def param_specs(config: ModelConfig) -> Params:
    """Where each parameter lives: one dimension split over the hosts of a slice (`fsdp`), the other
    over a host's devices (`model`: attention heads and the MLP hidden dimension, Megatron-style)."""
    layer = {
        "qkv": P("fsdp", "model"),
        "out": P("model", "fsdp"),
        "w1": P("fsdp", "model"),
        "w2": P("model", "fsdp"),
        "ln1": P("fsdp"),
        "ln2": P("fsdp"),
    }
    return {
        "embed": P("fsdp", "model"),
        "pos": P("fsdp", None),
        "layers": [dict(layer) for _ in range(config.layers)],
        "ln_f": P("fsdp"),
    }


def gathered_spec(spec: P) -> P:
    """The layout a host computes with: the parameter whole across the slice's hosts, still split
    over its own devices (what FSDP's all-gather produces)."""
    return P(*(None if axis == "fsdp" else axis for axis in spec))


Leaf = TypeVar("Leaf")
"""jax.Array for values; a sharding or a ShapeDtypeStruct where the same tree describes layout."""


class Batch(NamedTuple, Generic[Leaf]):
    """One step's global batch laid out by a ChunkPlan, each host slot on its host."""

    tokens: Leaf
    """[micro_steps, hosts, batch_per_host, seq_len + 1]"""
    weights: Leaf
    """[micro_steps, hosts]: 1 for a real chunk, 0 for padding"""


class LocalGrads(NamedTuple, Generic[Leaf]):
    """Each host's gradient and loss, summed over its chunks: a leading host axis."""

    grad_sums: Any
    """Shaped like the parameters, each leaf with a leading [hosts] axis."""
    loss_sums: Leaf
    """[hosts]"""


def host_mesh(devices: Any, hosts_per_slice: int) -> Mesh:
    """The (replica, fsdp, model) mesh over this generation's devices.

    Hosts are ranked slice by slice (the supervisor numbers a generation's processes so), and each
    host's devices are consecutive: [slices, hosts_per_slice, devices_per_host].
    """
    ordered = sorted(devices, key=lambda device: (device.process_index, device.id))
    processes = len({device.process_index for device in ordered})
    if processes % hosts_per_slice:
        raise ValueError(f"{processes} hosts do not make whole slices of {hosts_per_slice} hosts")
    grid = np.array(ordered).reshape(processes // hosts_per_slice, hosts_per_slice, -1)
    return Mesh(grid, AXES)


class ShardedModel:
    """The model laid out on a (replica, fsdp, model) mesh (`host_mesh`): shardings, a jitted init,
    the two programs of a step, and the gather that turns each host's shard into what it computes on.

    The mesh's `replica` axis is the slices taking part (this generation's); the global batch is sized
    for `full_hosts` hosts whatever that is.
    """

    def __init__(self, config: ModelConfig, mesh: Mesh, *, full_hosts: int) -> None:
        if mesh.axis_names != AXES:
            raise ValueError(f"the mesh's axes must be {AXES}, not {mesh.axis_names}")
        self.config = config
        self.mesh = mesh
        self.plan = ChunkPlan(chunks=full_hosts, host_count=mesh.shape["replica"] * mesh.shape["fsdp"])
        self.tx = optimizer(config)
        specs = param_specs(config)
        self.param_specs = specs
        abstract_params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
        _check_divisible(abstract_params, specs, mesh)
        self.param_shardings = _shardings(mesh, specs)
        gathered = jax.tree_util.tree_map(gathered_spec, specs, is_leaf=_is_spec)
        self.gathered_shardings = _shardings(mesh, gathered)
        # Per-host sums: a leading host axis, the gathered parameter's layout below it.
        self.grad_sum_shardings = _shardings(
            mesh, jax.tree_util.tree_map(lambda spec: P(HOSTS, *spec), gathered, is_leaf=_is_spec)
        )
        self.tokens_sharding = NamedSharding(mesh, P(None, HOSTS, None, None))
        self.weights_sharding = NamedSharding(mesh, P(None, HOSTS))
        self.loss_sums_sharding = NamedSharding(mesh, P(HOSTS))
        abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
        replicated = NamedSharding(mesh, P())
        # Optimizer moments follow their parameter's sharding; counters are replicated.
        self.opt_shardings = _match_param_shardings(
            abstract_opt, abstract_params, self.param_shardings, replicated
        )
        self.state_shardings = {"params": self.param_shardings, "opt": self.opt_shardings}
        self._init: Any = jax.jit(self._init_state, out_shardings=self.state_shardings)
        self._gather: Any = jax.jit(
            self._gather_over_slice,
            in_shardings=(self.param_shardings,),
            out_shardings=self.gathered_shardings,
        )
        local_out = LocalGrads(self.grad_sum_shardings, self.loss_sums_sharding)
        self._local_grads: Any = jax.jit(
            self._host_gradients,
            in_shardings=(self.gathered_shardings, Batch(self.tokens_sharding, self.weights_sharding)),
            out_shardings=local_out,
        )
        self._apply: Any = jax.jit(
            self._reduce_update_and_gather,
            in_shardings=(self.state_shardings, local_out),
            out_shardings=(self.state_shardings, self.gathered_shardings, replicated),
            donate_argnums=0,
        )

    def _init_state(self, seed: jax.Array | int) -> dict[str, Any]:
        params = init_params(self.config, jax.random.key(seed))
        return {"params": params, "opt": self.tx.init(params)}

    def _host_gradients(self, params: Params, batch: Batch[jax.Array]) -> LocalGrads[jax.Array]:
        """Each host sums the gradients of its own chunks on the gathered parameters: nothing here
        crosses hosts (only the `model` axis within a host communicates)."""

        def one_host(tokens: jax.Array, weights: jax.Array) -> tuple[Any, jax.Array]:
            def micro_step(carry: tuple[Any, jax.Array], chunk: tuple[jax.Array, jax.Array]) -> Any:
                grad_sum, loss_sum = carry
                rows, weight = chunk
                loss, grads = jax.value_and_grad(lambda p: loss_fn(self.config, p, rows))(params)
                grad_sum = jax.tree_util.tree_map(lambda s, g: s + weight * g, grad_sum, grads)
                return (grad_sum, loss_sum + weight * loss), None

            zeros = (jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
            sums, _ = jax.lax.scan(micro_step, zeros, (tokens, weights))
            return sums  # type: ignore[no-any-return]

        grad_sums, loss_sums = jax.vmap(one_host, in_axes=1)(batch.tokens, batch.weights)
        return LocalGrads(grad_sums, loss_sums)

    def _reduce_update_and_gather(
        self, state: dict[str, Any], local: LocalGrads[jax.Array]
    ) -> tuple[dict[str, Any], Params, jax.Array]:
        """Sum over every host and average over the real chunks, each host keeping the part of the
        sum its shard needs (a reduce-scatter); update each host's shard of the state; gather the new
        parameters over the slice for the next step's local work.

        The optimizer counts steps, not micro-steps: the learning-rate schedule is the same in
        every world size.
        """
        chunks = self.plan.chunks
        grads = jax.tree_util.tree_map(lambda g: g.sum(axis=0) / chunks, local.grad_sums)
        grads = jax.lax.with_sharding_constraint(grads, self.param_shardings)
        updates, opt = self.tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        gathered = self._gather_over_slice(params)
        return {"params": params, "opt": opt}, gathered, local.loss_sums.sum() / chunks

    def _gather_over_slice(self, params: Params) -> Params:
        """FSDP's all-gather: every parameter whole across the slice's hosts (still split over each
        host's devices), in one collective. Left to XLA, each parameter is gathered on its own (15
        all-gathers for the reference model), and each is a round of messages between the hosts'
        processes (gloo on CPU, the data-centre network between TPU hosts): a device's block of every
        parameter goes into one vector, the vectors are gathered once, and each parameter is put back
        together from its blocks. Data is only moved, never summed: the values are those of one
        all-gather a parameter, bit for bit."""
        leaves, tree = jax.tree_util.tree_flatten(params)
        specs = jax.tree_util.tree_leaves(self.param_specs, is_leaf=_is_spec)
        dims = [tuple(spec).index("fsdp") for spec in specs]

        def on_each_device(*blocks: jax.Array) -> tuple[jax.Array, ...]:
            gathered = jax.lax.all_gather(jnp.concatenate([block.reshape(-1) for block in blocks]), "fsdp")
            wholes, start = [], 0
            for block, dim in zip(blocks, dims, strict=True):
                pieces = gathered[:, start : start + block.size].reshape(gathered.shape[0], *block.shape)
                start += block.size
                shape = (*block.shape[:dim], -1, *block.shape[dim + 1 :])
                wholes.append(jnp.moveaxis(pieces, 0, dim).reshape(shape))  # host 0's block first
            return tuple(wholes)

        gather = jax.shard_map(
            on_each_device,
            mesh=self.mesh,
            in_specs=tuple(specs),
            out_specs=tuple(gathered_spec(spec) for spec in specs),
            # A parameter not split over `model` is the same on each of a host's devices; cut from
            # one vector with those that are, JAX cannot tell, so it is not asked to check.
            check_vma=False,
        )
        return jax.tree_util.tree_unflatten(tree, gather(*leaves))  # type: ignore[no-any-return]

    def compile(self, programs: ProgramCache | None = None) -> None:
        """Compile a step's programs ahead of time; with `programs`, load the ones this process
        compiled before (a restart) instead, keyed by `signature()` so that a hit traces nothing
        (workload/compiled_programs.py)."""
        lowerings = {
            "gather": lambda: self._gather.lower(self.abstract_state()["params"]),
            "local_grads": lambda: self._local_grads.lower(self.abstract_gathered(), self.abstract_batch()),
            "apply": lambda: self._apply.lower(self.abstract_state(), self._abstract_local()),
        }
        compiled = {
            name: lower().compile()
            if programs is None
            else programs.load_or_compile(name, lower, signature=self.signature(name))
            for name, lower in lowerings.items()
        }
        self._gather, self._local_grads, self._apply = (
            compiled[n] for n in ("gather", "local_grads", "apply")
        )

    def signature(self, name: str) -> str:
        """Everything program `name` depends on beyond what ProgramCache adds itself (versions,
        flags, jax's configuration, this process's place in the world): the model's configuration
        and the code that builds the programs, the mesh, the batch plan, the shardings."""
        return repr(
            (
                name,
                self.config,
                self.plan,
                self.mesh.axis_names,
                self.mesh.devices.shape,
                [device.id for device in self.mesh.devices.flat],
                self.state_shardings,
                self.gathered_shardings,
                self.grad_sum_shardings,
                self.tokens_sharding,
                self.weights_sharding,
                optax.__version__,
                _CODE_DIGEST,
            )
        )

    def _abstract_local(self) -> LocalGrads[jax.ShapeDtypeStruct]:
        local = jax.eval_shape(self._host_gradients, self.abstract_gathered(), self.abstract_batch())
        return jax.tree_util.tree_map(  # type: ignore[no-any-return]
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            local,
            LocalGrads(self.grad_sum_shardings, self.loss_sums_sharding),
        )

    def init_state(self, seed: int, programs: ProgramCache | None = None) -> dict[str, Any]:
        """The state a fresh job starts from; with `programs`, its program loaded when this process
        compiled it before (the seed is an argument, not part of the program)."""
        init = self._init
        if programs is not None:
            lower = lambda: self._init.lower(jax.ShapeDtypeStruct((), np.int32))  # noqa: E731
            init = programs.load_or_compile("init", lower, signature=self.signature("init"))
        state: dict[str, Any] = init(np.int32(seed))
        jax.block_until_ready(state)
        return state

    def gather(self, params: Params) -> Params:
        """Each host's shard of the parameters -> the parameters it computes on (blocks)."""
        gathered: Params = self._gather(params)
        jax.block_until_ready(gathered)
        return gathered

    def abstract_state(self) -> Any:
        shapes = jax.eval_shape(lambda: self._init_state(0))
        return _with_shardings(shapes, self.state_shardings)

    def abstract_gathered(self) -> Any:
        shapes = jax.eval_shape(lambda: init_params(self.config, jax.random.key(0)))
        return _with_shardings(shapes, self.gathered_shardings)

    def abstract_batch(self) -> Batch[jax.ShapeDtypeStruct]:
        plan, config = self.plan, self.config
        return Batch(
            jax.ShapeDtypeStruct(
                (plan.micro_steps, plan.host_count, config.batch_per_host, config.seq_len + 1),
                np.int32,
                sharding=self.tokens_sharding,
            ),
            jax.ShapeDtypeStruct(
                (plan.micro_steps, plan.host_count), np.float32, sharding=self.weights_sharding
            ),
        )

    def global_batch(self, seed: int, step: int) -> Batch[jax.Array]:
        """The step's global batch (a function of seed and step, sized for the full job), laid out."""
        rows = synthetic_batch(self.config, seed, step, self.plan.chunks * self.config.batch_per_host)
        return Batch(
            _from_host(self.plan.lay_out(rows), self.tokens_sharding),
            _from_host(self.plan.weights(), self.weights_sharding),
        )

    def local_grads(self, params: Params, batch: Batch[jax.Array]) -> LocalGrads[jax.Array]:
        """Phase one of a step, on the gathered parameters: this host's own work, blocked on. No
        cross-host communication."""
        local: LocalGrads[jax.Array] = self._local_grads(params, batch)
        jax.block_until_ready(local)
        return local

    def apply(
        self, state: dict[str, Any], local: LocalGrads[jax.Array]
    ) -> tuple[dict[str, Any], Params, float]:
        """Phase two: reduce, update, gather; `state` is donated. Returns the new state, the gathered
        parameters for the next step and the step's mean loss."""
        state, gathered, loss = self._apply(state, local)
        jax.block_until_ready(gathered)
        return state, gathered, float(loss)  # blocks: never queue sharded steps (CPU collectives)


def _is_spec(node: Any) -> bool:
    return isinstance(node, P)


def _shardings(mesh: Mesh, specs: Any) -> Any:
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=_is_spec)


def _with_shardings(shapes: Any, shardings: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes, shardings
    )


def _check_divisible(abstract_params: Any, specs: Any, mesh: Mesh) -> None:
    """Every split dimension must divide evenly over its mesh axis: say which one does not."""
    flat_specs = jax.tree_util.tree_leaves(specs, is_leaf=_is_spec)
    flat_params = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    for (path, leaf), spec in zip(flat_params, flat_specs, strict=True):
        for size, axis in zip(leaf.shape, spec, strict=False):
            if axis is not None and size % mesh.shape[axis]:
                name = jax.tree_util.keystr(path, simple=True, separator="/")
                raise ValueError(
                    f"parameter {name} {leaf.shape}: dimension {size} does not split over the "
                    f"{mesh.shape[axis]} {'hosts of a slice' if axis == 'fsdp' else 'devices of a host'} "
                    f"(mesh axis {axis!r}); choose a model size or job shape that divides"
                )


def _from_host(values: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from a copy every process holds in full (each places its own shards)."""
    return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])


def _match_param_shardings(
    abstract_opt: Any, abstract_params: Any, param_shardings: Any, default: Any
) -> Any:
    """Give each optimizer leaf shaped like a parameter that parameter's sharding."""
    params_def: Any = jax.tree_util.tree_structure(abstract_params)

    def assign(subtree: Any) -> Any:
        if jax.tree_util.tree_structure(subtree) == params_def:
            return param_shardings
        return jax.tree_util.tree_map(lambda _: default, subtree)

    return jax.tree_util.tree_map(
        assign, abstract_opt, is_leaf=lambda node: jax.tree_util.tree_structure(node) == params_def
    )

"""A tiny decoder-only transformer language model, sharded over a (data, model) mesh.

Small enough to train on CPU devices in a fraction of a second per step, real enough to exercise
what matters for resilience: parameters and optimizer state sharded across hosts, a data-parallel
all-reduce every step, and a loss that goes down.

A step is two programs so that the job can shrink and grow by whole data-parallel replicas without
changing what it trains on: `local_grads` lets every replica work through its share of a global
batch sized for the full job (accumulating over micro-steps when replicas are missing) with no
cross-host communication, and `apply` all-reduces the gradient sums and updates the state. The
boundary between them is also where a host's own work ends and its wait for the others begins,
which is what the supervisor's straggler score measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 128
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    d_ff: int = 256
    seq_len: int = 32
    batch_per_host: int = 4
    learning_rate: float = 3e-3


def param_specs(config: ModelConfig) -> Params:
    """Megatron-style: attention heads and the MLP hidden dimension split over the model axis."""
    layer = {
        "qkv": P(None, "model"),
        "out": P("model", None),
        "w1": P(None, "model"),
        "w2": P("model", None),
        "ln1": P(None),
        "ln2": P(None),
    }
    return {
        "embed": P(None, "model"),
        "pos": P(None, None),
        "layers": [dict(layer) for _ in range(config.layers)],
        "ln_f": P(None),
    }


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    keys = iter(jax.random.split(key, 2 + 4 * config.layers))

    def dense(shape: tuple[int, ...]) -> jax.Array:
        values: jax.Array = jax.random.normal(next(keys), shape, jnp.float32)
        return jnp.asarray(values * (shape[0] ** -0.5))

    d = config.d_model
    return {
        "embed": jax.random.normal(next(keys), (config.vocab, d), jnp.float32) * 0.02,
        "pos": jax.random.normal(next(keys), (config.seq_len, d), jnp.float32) * 0.02,
        "layers": [
            {
                "qkv": dense((d, 3 * d)),
                "out": dense((d, d)),
                "w1": dense((d, config.d_ff)),
                "w2": dense((config.d_ff, d)),
                "ln1": jnp.ones((d,), jnp.float32),
                "ln2": jnp.ones((d,), jnp.float32),
            }
            for _ in range(config.layers)
        ],
        "ln_f": jnp.ones((d,), jnp.float32),
    }


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def forward(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    batch, seq = tokens.shape
    head_dim = config.d_model // config.heads
    x = params["embed"][tokens] + params["pos"][:seq]
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    for layer in params["layers"]:
        h = _norm(x, layer["ln1"])
        q, k, v = jnp.split(h @ layer["qkv"], 3, axis=-1)
        q, k, v = (t.reshape(batch, seq, config.heads, head_dim) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
        attention = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(batch, seq, config.d_model)
        x = x + mixed @ layer["out"]
        x = x + jax.nn.gelu(_norm(x, layer["ln2"]) @ layer["w1"]) @ layer["w2"]
    logits: jax.Array = _norm(x, params["ln_f"]) @ params["embed"].T
    return logits


def loss_fn(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    logits = forward(config, params, tokens[:, :-1])
    losses: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return losses.mean()


def optimizer(config: ModelConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, 20, 2000, 0.1 * config.learning_rate
    )
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def synthetic_batch(config: ModelConfig, seed: int, step: int, global_batch: int) -> np.ndarray:
    """The global batch for `step`: a pure function of (seed, step), so a restored job replays it.

    Each row is an arithmetic progression modulo the vocabulary, with its own start and stride:
    a pattern a small model learns quickly, so the loss visibly falls.
    """
    rng = np.random.default_rng([seed, step])
    start = rng.integers(0, config.vocab, (global_batch, 1))
    stride = rng.integers(1, 8, (global_batch, 1))
    positions = np.arange(config.seq_len + 1)[None, :]
    return ((start + stride * positions) % config.vocab).astype(np.int32)


@dataclass(frozen=True)
class ChunkPlan:
    """Where each chunk of the global batch is computed when `replicas` replicas share `chunks`.

    The global batch is sized for the full job: one chunk of `batch_per_host` rows per host of the
    full job. With fewer replicas each one works through several chunks in turn (micro-steps) and
    sums their gradients: chunk c goes to replica c % replicas at micro-step c // replicas. Slots
    past the last chunk are padding with weight 0. With every replica present it is one chunk each.
    """

    chunks: int
    replicas: int

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= self.chunks:
            raise ValueError(f"{self.replicas} replicas cannot share a batch of {self.chunks} chunks")

    @property
    def micro_steps(self) -> int:
        return -(-self.chunks // self.replicas)

    def slot(self, chunk: int) -> tuple[int, int]:
        """(micro-step, replica) that computes `chunk`."""
        return divmod(chunk, self.replicas)

    def chunk_at(self, micro_step: int, replica: int) -> int | None:
        """The chunk computed at this slot, or None for padding."""
        chunk = micro_step * self.replicas + replica
        return chunk if chunk < self.chunks else None

    def weights(self) -> np.ndarray:
        """[micro_steps, replicas]: 1 for a real chunk, 0 for padding."""
        slots = np.arange(self.micro_steps * self.replicas).reshape(self.micro_steps, self.replicas)
        return (slots < self.chunks).astype(np.float32)

    def lay_out(self, rows: np.ndarray) -> np.ndarray:
        """Global batch rows [chunks * n, ...] as [micro_steps, replicas, n, ...], zero-padded.

        Slot (m, r) holds chunk m * replicas + r, so a plain reshape of the padded rows does it.
        """
        per_chunk, remainder = divmod(len(rows), self.chunks)
        if remainder:
            raise ValueError(f"{len(rows)} rows do not split into {self.chunks} chunks")
        padding = np.zeros(
            ((self.micro_steps * self.replicas - self.chunks) * per_chunk, *rows.shape[1:]), rows.dtype
        )
        padded = np.concatenate([rows, padding])
        return padded.reshape(self.micro_steps, self.replicas, per_chunk, *rows.shape[1:])


Leaf = TypeVar("Leaf")
"""jax.Array for values; a sharding or a ShapeDtypeStruct where the same tree describes layout."""


class Batch(NamedTuple, Generic[Leaf]):
    """One step's global batch laid out by a ChunkPlan, sharded over the replicas."""

    tokens: Leaf
    """[micro_steps, replicas, batch_per_host, seq_len + 1]"""
    weights: Leaf
    """[micro_steps, replicas]: 1 for a real chunk, 0 for padding"""


class LocalGrads(NamedTuple, Generic[Leaf]):
    """Each replica's gradient and loss, summed over its chunks: a leading replica axis."""

    grad_sums: Any
    """Shaped like the parameters, each leaf with a leading [replicas] axis."""
    loss_sums: Leaf
    """[replicas]"""


class ShardedModel:
    """The model laid out on a mesh: shardings, a jitted init and the two programs of a step.

    The mesh's `data` axis is the replicas taking part (the hosts of this generation); the global
    batch is sized for `full_hosts` hosts whatever that is.
    """

    def __init__(self, config: ModelConfig, mesh: Mesh, *, full_hosts: int) -> None:
        self.config = config
        self.mesh = mesh
        self.plan = ChunkPlan(chunks=full_hosts, replicas=mesh.shape["data"])
        self.tx = optimizer(config)
        specs = param_specs(config)
        self.param_shardings = _shardings(mesh, specs)
        # Per-replica sums: a leading replica axis over `data`, the parameter's layout below it.
        self.grad_sum_shardings = _shardings(
            mesh, jax.tree_util.tree_map(lambda spec: P("data", *spec), specs, is_leaf=_is_spec)
        )
        self.tokens_sharding = NamedSharding(mesh, P(None, "data", None, None))
        self.weights_sharding = NamedSharding(mesh, P(None, "data"))
        self.loss_sums_sharding = NamedSharding(mesh, P("data"))
        abstract_params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
        abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
        replicated = NamedSharding(mesh, P())
        # Optimizer moments follow their parameter's sharding; counters are replicated.
        self.opt_shardings = _match_param_shardings(
            abstract_opt, abstract_params, self.param_shardings, replicated
        )
        self.state_shardings = {"params": self.param_shardings, "opt": self.opt_shardings}
        self._init = jax.jit(self._init_state, static_argnums=0, out_shardings=self.state_shardings)
        local_out = LocalGrads(self.grad_sum_shardings, self.loss_sums_sharding)
        self._local_grads: Any = jax.jit(
            self._replica_gradients,
            in_shardings=(self.param_shardings, Batch(self.tokens_sharding, self.weights_sharding)),
            out_shardings=local_out,
        )
        self._apply: Any = jax.jit(
            self._all_reduce_and_update,
            in_shardings=(self.state_shardings, local_out),
            out_shardings=(self.state_shardings, replicated),
            donate_argnums=0,
        )

    def _init_state(self, seed: int) -> dict[str, Any]:
        params = init_params(self.config, jax.random.key(seed))
        return {"params": params, "opt": self.tx.init(params)}

    def _replica_gradients(self, params: Params, batch: Batch[jax.Array]) -> LocalGrads[jax.Array]:
        """Each replica sums the gradients of its own chunks; params are replicated over `data`,
        so nothing here crosses hosts (only the `model` axis within a host communicates)."""

        def one_replica(tokens: jax.Array, weights: jax.Array) -> tuple[Any, jax.Array]:
            def micro_step(carry: tuple[Any, jax.Array], chunk: tuple[jax.Array, jax.Array]) -> Any:
                grad_sum, loss_sum = carry
                rows, weight = chunk
                loss, grads = jax.value_and_grad(lambda p: loss_fn(self.config, p, rows))(params)
                grad_sum = jax.tree_util.tree_map(lambda s, g: s + weight * g, grad_sum, grads)
                return (grad_sum, loss_sum + weight * loss), None

            zeros = (jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
            sums, _ = jax.lax.scan(micro_step, zeros, (tokens, weights))
            return sums  # type: ignore[no-any-return]

        grad_sums, loss_sums = jax.vmap(one_replica, in_axes=1)(batch.tokens, batch.weights)
        return LocalGrads(grad_sums, loss_sums)

    def _all_reduce_and_update(
        self, state: dict[str, Any], local: LocalGrads[jax.Array]
    ) -> tuple[dict[str, Any], jax.Array]:
        """Sum over the replicas (the cross-host all-reduce), average over the real chunks, update.

        The optimizer counts steps, not micro-steps: the learning-rate schedule is the same in
        every world size.
        """
        chunks = self.plan.chunks
        grads = jax.tree_util.tree_map(lambda g: g.sum(axis=0) / chunks, local.grad_sums)
        updates, opt = self.tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt": opt}, local.loss_sums.sum() / chunks

    def compile(self) -> None:
        """Compile both programs ahead of time (the persistent compilation cache may serve them)."""
        params = self.abstract_state()["params"]
        self._local_grads = self._local_grads.lower(params, self.abstract_batch()).compile()
        local = jax.eval_shape(self._replica_gradients, params, self.abstract_batch())
        local = jax.tree_util.tree_map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            local,
            LocalGrads(self.grad_sum_shardings, self.loss_sums_sharding),
        )
        self._apply = self._apply.lower(self.abstract_state(), local).compile()

    def init_state(self, seed: int) -> dict[str, Any]:
        return self._init(seed)  # type: ignore[no-any-return]

    def abstract_state(self) -> Any:
        shapes = jax.eval_shape(lambda: self._init_state(0))
        return jax.tree_util.tree_map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            shapes,
            self.state_shardings,
        )

    def abstract_batch(self) -> Batch[jax.ShapeDtypeStruct]:
        plan, config = self.plan, self.config
        return Batch(
            jax.ShapeDtypeStruct(
                (plan.micro_steps, plan.replicas, config.batch_per_host, config.seq_len + 1),
                np.int32,
                sharding=self.tokens_sharding,
            ),
            jax.ShapeDtypeStruct(
                (plan.micro_steps, plan.replicas), np.float32, sharding=self.weights_sharding
            ),
        )

    def global_batch(self, seed: int, step: int) -> Batch[jax.Array]:
        """The step's global batch (a function of seed and step, sized for the full job), laid out."""
        rows = synthetic_batch(self.config, seed, step, self.plan.chunks * self.config.batch_per_host)
        return Batch(
            _from_host(self.plan.lay_out(rows), self.tokens_sharding),
            _from_host(self.plan.weights(), self.weights_sharding),
        )

    def local_grads(self, state: dict[str, Any], batch: Batch[jax.Array]) -> LocalGrads[jax.Array]:
        """Phase one of a step: this host's own work, blocked on. No cross-host communication."""
        local: LocalGrads[jax.Array] = self._local_grads(state["params"], batch)
        jax.block_until_ready(local)
        return local

    def apply(self, state: dict[str, Any], local: LocalGrads[jax.Array]) -> tuple[dict[str, Any], float]:
        """Phase two: all-reduce and update; `state` is donated. Returns the step's mean loss."""
        state, loss = self._apply(state, local)
        return state, float(loss)  # float() blocks: never queue sharded steps (CPU collectives)


def _is_spec(node: Any) -> bool:
    return isinstance(node, P)


def _shardings(mesh: Mesh, specs: Any) -> Any:
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=_is_spec)


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

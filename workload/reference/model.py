"""A tiny decoder-only transformer language model, sharded over a (data, model) mesh.

Small enough to train on CPU devices in a fraction of a second per step, real enough to exercise
what matters for resilience: parameters and optimizer state sharded across hosts, a data-parallel
all-reduce every step, and a loss that goes down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


class ShardedModel:
    """The model laid out on a mesh: shardings, a jitted init and a jitted train step."""

    def __init__(self, config: ModelConfig, mesh: Mesh) -> None:
        self.config = config
        self.mesh = mesh
        self.tx = optimizer(config)
        self.param_shardings = jax.tree_util.tree_map(
            lambda spec: NamedSharding(mesh, spec), param_specs(config), is_leaf=lambda x: isinstance(x, P)
        )
        self.batch_sharding = NamedSharding(mesh, P("data", None))
        abstract_params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
        abstract_opt = jax.eval_shape(self.tx.init, abstract_params)
        replicated = NamedSharding(mesh, P())
        # Optimizer moments follow their parameter's sharding; counters are replicated.
        self.opt_shardings = _match_param_shardings(
            abstract_opt, abstract_params, self.param_shardings, replicated
        )
        self.state_shardings = {"params": self.param_shardings, "opt": self.opt_shardings}
        self._compiled_step: Any = None
        self._init = jax.jit(self._init_state, static_argnums=0, out_shardings=self.state_shardings)
        self._step = jax.jit(
            self._train_step,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, NamedSharding(mesh, P())),
            donate_argnums=0,
        )

    def _init_state(self, seed: int) -> dict[str, Any]:
        params = init_params(self.config, jax.random.key(seed))
        return {"params": params, "opt": self.tx.init(params)}

    def _train_step(self, state: dict[str, Any], tokens: jax.Array) -> tuple[dict[str, Any], jax.Array]:
        loss, grads = jax.value_and_grad(lambda p: loss_fn(self.config, p, tokens))(state["params"])
        updates, opt = self.tx.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    def compile(self) -> None:
        """Compile the train step ahead of time (the persistent compilation cache may serve it)."""
        batch = jax.ShapeDtypeStruct(
            (self.config.batch_per_host * jax.process_count(), self.config.seq_len + 1),
            np.int32,
            sharding=self.batch_sharding,
        )
        self._compiled_step = self._step.lower(self.abstract_state(), batch).compile()

    def init_state(self, seed: int) -> dict[str, Any]:
        return self._init(seed)  # type: ignore[no-any-return]

    def abstract_state(self) -> Any:
        shapes = jax.eval_shape(lambda: self._init_state(0))
        return jax.tree_util.tree_map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            shapes,
            self.state_shardings,
        )

    def global_batch(self, seed: int, step: int) -> jax.Array:
        global_batch = self.config.batch_per_host * jax.process_count()
        tokens = synthetic_batch(self.config, seed, step, global_batch)
        return jax.make_array_from_callback(tokens.shape, self.batch_sharding, lambda index: tokens[index])

    def train_step(self, state: dict[str, Any], tokens: jax.Array) -> tuple[dict[str, Any], float]:
        step = self._compiled_step if self._compiled_step is not None else self._step
        state, loss = step(state, tokens)
        return state, float(loss)  # float() blocks: never queue sharded steps (CPU collectives)


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

"""A tiny decoder-only transformer language model as plain JAX functions.

Its size, parameters, forward pass, loss and optimizer, and nothing about meshes, hosts or slices:
`model.py` lays them out on the (replica, fsdp, model) mesh and splits a step into the two programs
the supervisor times, so the mathematics and the layout each read on their own.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from slicekeeper.workload.reference.batches import ModelConfig

Params = dict[str, Any]
__all__ = ["ModelConfig", "Params", "forward", "init_params", "loss_fn", "optimizer"]


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

"""The tiny language model of the reference trainers in PyTorch: parameters, forward pass, loss, and
the optimizer's update of one host's shard.

The same model as the JAX trainer's (transformer.py: RMS norms, causal attention, a GELU MLP, tied
input and output embeddings) and the same optimizer (gradients clipped to a global norm of 1, AdamW
on a warm-up then cosine schedule), written for tensors on one host. Nothing here knows of hosts or
slices: `torch_sharded.py` lays the parameters out over the hosts and reduces the gradients.

Parameters are a flat, ordered mapping of names (`layers/0/qkv`) to tensors: the order is the leaf
order of the checkpoint's shard names, so it never changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from slicekeeper.workload.reference.batches import ModelConfig

Params = dict[str, torch.Tensor]

BETA1, BETA2, EPSILON, WEIGHT_DECAY = 0.9, 0.999, 1e-8, 0.01
WARMUP_STEPS, DECAY_STEPS = 20, 2000
MAX_GRAD_NORM = 1.0


def init_params(config: ModelConfig, seed: int) -> Params:
    """The initial parameters, a pure function of the seed (the same on every host)."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    d = config.d_model
    params: Params = {"embed": normal(config.vocab, d) * 0.02, "pos": normal(config.seq_len, d) * 0.02}
    for layer in range(config.layers):
        params[f"layers/{layer}/qkv"] = normal(d, 3 * d) * d**-0.5
        params[f"layers/{layer}/out"] = normal(d, d) * d**-0.5
        params[f"layers/{layer}/w1"] = normal(d, config.d_ff) * d**-0.5
        params[f"layers/{layer}/w2"] = normal(config.d_ff, d) * config.d_ff**-0.5
        params[f"layers/{layer}/ln1"] = torch.ones(d)
        params[f"layers/{layer}/ln2"] = torch.ones(d)
    params["ln_f"] = torch.ones(d)
    return params


def _norm(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * scale


def forward(config: ModelConfig, params: Params, tokens: torch.Tensor) -> torch.Tensor:
    batch, seq = tokens.shape
    head_dim = config.d_model // config.heads
    x = params["embed"][tokens] + params["pos"][:seq]
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=tokens.device))
    for layer in range(config.layers):
        p = {name: params[f"layers/{layer}/{name}"] for name in ("qkv", "out", "w1", "w2", "ln1", "ln2")}
        h = _norm(x, p["ln1"])
        q, k, v = (t.reshape(batch, seq, config.heads, head_dim) for t in (h @ p["qkv"]).chunk(3, dim=-1))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        attention = torch.softmax(scores.masked_fill(~causal, -1e9), dim=-1)
        mixed = torch.einsum("bhqk,bkhd->bqhd", attention, v).reshape(batch, seq, config.d_model)
        x = x + mixed @ p["out"]
        x = x + torch.nn.functional.gelu(_norm(x, p["ln2"]) @ p["w1"], approximate="tanh") @ p["w2"]
    return _norm(x, params["ln_f"]) @ params["embed"].T


def loss_and_grads(config: ModelConfig, params: Params, tokens: torch.Tensor) -> tuple[float, Params]:
    """The mean next-token loss on `tokens` [rows, seq_len + 1] and its gradient."""
    leaves = {name: value.detach().requires_grad_(True) for name, value in params.items()}
    logits = forward(config, leaves, tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab), tokens[:, 1:].reshape(-1))
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return float(loss.detach()), dict(zip(leaves, grads, strict=True))


def learning_rate(config: ModelConfig, count: int) -> float:
    """Linear warm-up from 0 over WARMUP_STEPS, then cosine decay to a tenth by DECAY_STEPS; `count`
    is the number of updates already made (optax's warmup_cosine_decay_schedule)."""
    peak, end = config.learning_rate, 0.1 * config.learning_rate
    if count < WARMUP_STEPS:
        return peak * count / WARMUP_STEPS
    progress = min(count - WARMUP_STEPS, DECAY_STEPS - WARMUP_STEPS) / (DECAY_STEPS - WARMUP_STEPS)
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


def clip_factor(grads: Params) -> float:
    """What the whole gradient is scaled by so that its global norm is at most MAX_GRAD_NORM."""
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    return 1.0 if norm <= MAX_GRAD_NORM else MAX_GRAD_NORM / norm


@dataclass
class AdamWShard:
    """AdamW's moments for one host's shard of every parameter, and the update count (replicated)."""

    mu: Params
    nu: Params
    count: int = 0

    @classmethod
    def zeros_like(cls, shard: Params) -> AdamWShard:
        return cls(
            {n: torch.zeros_like(t) for n, t in shard.items()},
            {n: torch.zeros_like(t) for n, t in shard.items()},
        )

    def update(self, config: ModelConfig, shard: Params, grads: Params) -> Params:
        """The new shard after one step on `grads` (this shard's rows of the clipped gradient)."""
        rate = learning_rate(config, self.count)
        self.count += 1
        fresh: Params = {}
        for name, value in shard.items():
            grad = grads[name]
            self.mu[name] = BETA1 * self.mu[name] + (1 - BETA1) * grad
            self.nu[name] = BETA2 * self.nu[name] + (1 - BETA2) * grad * grad
            mu_hat = self.mu[name] / (1 - BETA1**self.count)
            nu_hat = self.nu[name] / (1 - BETA2**self.count)
            fresh[name] = value - rate * (mu_hat / (nu_hat.sqrt() + EPSILON) + WEIGHT_DECAY * value)
        return fresh

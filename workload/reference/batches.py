"""What the reference trainers train on, with no framework: the model's size and the step's batch.

Both reference trainers (JAX, `model.py`; PyTorch, `torch_sharded.py`) train the same tiny language
model on the same data, a pure function of (seed, step), so a restored job replays exactly the
batches it lost. The global batch is sized for the full job whatever the world size of a generation:
`ChunkPlan` says which host computes which chunk of it when slices are missing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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


def trainer_arguments(prog: str, final_params: str) -> argparse.ArgumentParser:
    """The command line both reference trainers take: the seed, the model's size, and where to write
    the final parameters (`final_params` says who writes what)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--seed", type=int, default=0, help="model init and data seed")
    parser.add_argument("--d-model", type=int, default=ModelConfig.d_model)
    parser.add_argument("--layers", type=int, default=ModelConfig.layers)
    parser.add_argument("--batch-per-host", type=int, default=ModelConfig.batch_per_host)
    parser.add_argument("--seq-len", type=int, default=ModelConfig.seq_len)
    parser.add_argument("--final-params", type=Path, metavar="PATH", help=final_params)
    return parser


def model_config(args: argparse.Namespace) -> ModelConfig:
    """The model a trainer's parsed arguments ask for."""
    return ModelConfig(
        d_model=args.d_model, layers=args.layers, batch_per_host=args.batch_per_host, seq_len=args.seq_len
    )


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
    """Where each chunk of the global batch is computed when `host_count` hosts share `chunks` chunks.

    The global batch is sized for the full job: one chunk of `batch_per_host` rows per host of the
    full job. With fewer hosts (slices dropped) each one works through several chunks in turn
    (micro-steps) and sums their gradients: chunk c goes to host slot c % host_count at micro-step
    c // host_count. Slots past the last chunk are padding with weight 0. With every host present it is
    one chunk each. Host slot r is the host of rank r in this generation.
    """

    chunks: int
    host_count: int

    def __post_init__(self) -> None:
        if not 1 <= self.host_count <= self.chunks:
            raise ValueError(f"{self.host_count} hosts cannot share a batch of {self.chunks} chunks")

    @property
    def micro_steps(self) -> int:
        return -(-self.chunks // self.host_count)

    def slot(self, chunk: int) -> tuple[int, int]:
        """(micro-step, host slot) that computes `chunk`."""
        return divmod(chunk, self.host_count)

    def chunk_at(self, micro_step: int, host: int) -> int | None:
        """The chunk computed at this slot, or None for padding."""
        chunk = micro_step * self.host_count + host
        return chunk if chunk < self.chunks else None

    def weights(self) -> np.ndarray:
        """[micro_steps, hosts]: 1 for a real chunk, 0 for padding."""
        slots = np.arange(self.micro_steps * self.host_count).reshape(self.micro_steps, self.host_count)
        return (slots < self.chunks).astype(np.float32)

    def lay_out(self, rows: np.ndarray) -> np.ndarray:
        """Global batch rows [chunks * n, ...] as [micro_steps, hosts, n, ...], zero-padded.

        Slot (m, r) holds chunk m * hosts + r, so a plain reshape of the padded rows does it.
        """
        per_chunk, remainder = divmod(len(rows), self.chunks)
        if remainder:
            raise ValueError(f"{len(rows)} rows do not split into {self.chunks} chunks")
        padding = np.zeros(
            ((self.micro_steps * self.host_count - self.chunks) * per_chunk, *rows.shape[1:]), rows.dtype
        )
        padded = np.concatenate([rows, padding])
        return padded.reshape(self.micro_steps, self.host_count, per_chunk, *rows.shape[1:])

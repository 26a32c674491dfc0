"""The suite's JAX jobs compile at XLA's lowest backend optimization.

A compile of the reference model's step takes 4 s of CPU at XLA's defaults and about half of that
here (`--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true`, measured on the
reference model's three programs), and the suite compiles on every host of a job that starts with an
empty program cache: the operator's pods (each its own volume), a world seen for the first time (a
scaled-down job), the compile-again control. What the suite checks (what was restored, from where,
the final parameters against the fault-free run's under the same flags, what was compiled) does not
depend on the code XLA generates; its steps run slower (about 2x on the reference model's programs
alone), which the runs' pacing hides. `make demo` and the benchmarks keep XLA's defaults.
"""

from __future__ import annotations

import os

CHEAP_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def with_cheap_compile(flags: str = "") -> str:
    """`flags` (an XLA_FLAGS value) with the suite's compile options added, once."""
    return flags if CHEAP_COMPILE in flags else f"{flags} {CHEAP_COMPILE}".strip()


def use_cheap_compile() -> None:
    """This process's XLA_FLAGS, and so every run it starts, with the suite's compile options."""
    os.environ["XLA_FLAGS"] = with_cheap_compile(os.environ.get("XLA_FLAGS", ""))

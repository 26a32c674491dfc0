"""The figures of the operator scale benchmark (benchmarks/operator_scale.py): what one job size
measured, the table over the sizes and the targets' verdicts.

Apart from the run: the run fills the figures in, this module only reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

HOT_SWAP_TARGET_WRITES = 10
MEMORY_TARGET_MIB = 1024.0
MEMORY_TARGET_HOSTS = 25000


@dataclass
class Figures:
    hosts: int
    tpu_type: str
    slices: int
    hosts_per_slice: int
    seconds_to_all_pods: float = 0.0
    seconds_to_all_pods_at_50ms: float = 0.0
    """The same with the emulator answering every request 50 ms late (concurrency, not CPU, the limit)."""
    cpu_ms_per_pod: float = 0.0
    """Operator CPU milliseconds per pod while the pods were created."""
    pods_per_second: float = 0.0
    requests_per_pod: float = 0.0
    writes_per_pod: float = 0.0
    creation_requests: dict[str, int] = field(default_factory=dict)
    creation_operator_cpu_share: float = 0.0
    """Operator CPU seconds per second while the pods were created (1.0 = one core busy)."""
    creation_emulator_cpu_share: float = 0.0
    """The same for this process: the emulated API server (and the benchmark's bookkeeping)."""
    hot_swap_writes: int = 0
    hot_swap_breakdown: dict[str, int] = field(default_factory=dict)
    hot_swap_seconds: float = 0.0
    """Failed patch -> replacement pod exists."""
    idle_seconds: float = 0.0
    idle_cpu_share: float = 0.0
    """Operator CPU seconds per second of nothing happening (1.0 = one core busy)."""
    idle_requests_per_minute: float = 0.0
    idle_writes_per_minute: float = 0.0
    idle_requests: dict[str, int] = field(default_factory=dict)
    operator_idle_mib: float = 0.0
    """VmHWM after start-up, before the job."""
    operator_peak_mib_submitted: float = 0.0
    """VmHWM once every pod exists."""
    operator_peak_mib: float = 0.0
    """VmHWM at the end of the run (before the restart)."""
    delete_seconds: float = 0.0
    """The job deleted -> its pods and the job itself gone (the finalizer's cleanup)."""
    delete_requests_per_pod: float = 0.0
    delete_requests: dict[str, int] = field(default_factory=dict)
    operator_peak_mib_deleted: float = 0.0
    """VmHWM once the job is gone: the whole run, the cleanup included."""
    restart_seconds: float = 0.0
    """A fresh operator started -> it has resumed the job (its first status patch); or gave up."""
    restart_resumed: bool = False
    restart_replaced_seconds: float = 0.0
    """A fresh operator started -> the pod that failed while it was down has been replaced (0: not
    within the restart's timeout)."""
    restart_writes: int = 0
    restart_requests: dict[str, int] = field(default_factory=dict)
    operator_peak_mib_restart: float = 0.0
    """VmHWM of the restarted operator, once settled: its start-up listing of every pod included."""
    emulator_rss_mib: float = 0.0
    """This process (emulator and benchmark) at the end, for reference."""


# --- report ---------------------------------------------------------------------------------------
def restart_cell(f: Figures) -> str:
    if not f.restart_seconds:
        return "-"
    return f"{f.restart_seconds:.1f} s" if f.restart_resumed else f"> {f.restart_seconds:.0f} s"


COLUMNS: list[tuple[str, Callable[[Figures], str]]] = [
    ("hosts", lambda f: f"{f.hosts:,}"),
    ("job", lambda f: f"{f.slices:,} x {f.tpu_type}"),
    ("time to all pods", lambda f: f"{f.seconds_to_all_pods:.1f} s"),
    ("pods/s", lambda f: f"{f.pods_per_second:.0f}"),
    ("requests/pod", lambda f: f"{f.requests_per_pod:.3f}"),
    ("writes/pod", lambda f: f"{f.writes_per_pod:.3f}"),
    ("hot-swap writes", lambda f: str(f.hot_swap_writes)),
    ("operator peak: submitted", lambda f: f"{f.operator_peak_mib_submitted:.0f} MiB"),
    ("whole run", lambda f: f"{f.operator_peak_mib:.0f} MiB"),
    ("deleted after", lambda f: f"{f.delete_seconds:.1f} s" if f.delete_seconds else "-"),
    ("cleanup: peak", lambda f: f"{f.operator_peak_mib_deleted:.0f} MiB" if f.delete_seconds else "-"),
    ("restart: peak", lambda f: f"{f.operator_peak_mib_restart:.0f} MiB" if f.restart_seconds else "-"),
    ("resumed after", restart_cell),
    ("idle CPU", lambda f: f"{100 * f.idle_cpu_share:.0f} %" if f.idle_seconds else "-"),
]


def table(results: list[Figures]) -> str:
    """A Markdown table, one row per size."""
    rows = [[title for title, _ in COLUMNS], *([cell(f) for _, cell in COLUMNS] for f in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(cells: list[str]) -> str:
        aligned = [
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(aligned) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(rows[0]), rule, *(line(row) for row in rows[1:])])


def targets(results: list[Figures]) -> list[str]:
    lines = []
    worst = max(results, key=lambda f: f.hot_swap_writes)
    met = worst.hot_swap_writes <= HOT_SWAP_TARGET_WRITES
    lines.append(
        f"hot-swap <= {HOT_SWAP_TARGET_WRITES} API writes at every size: {'met' if met else 'MISSED'}"
        f" (at most {worst.hot_swap_writes}, at {worst.hosts} hosts)"
    )
    big = [f for f in results if f.hosts >= MEMORY_TARGET_HOSTS]
    if big:
        peak = max(f.operator_peak_mib_submitted for f in big)
        met = peak < MEMORY_TARGET_MIB
        lines.append(
            f"{MEMORY_TARGET_HOSTS}-host job submitted with operator peak < {MEMORY_TARGET_MIB:.0f} MiB:"
            f" {'met' if met else 'MISSED'} ({peak:.0f} MiB)"
        )
    else:
        lines.append(f"memory target: not measured (needs a size of {MEMORY_TARGET_HOSTS} hosts)")
    return lines


def summary(f: Figures) -> dict[str, float | int]:
    """The size's headline figures, as one JSON line (issue 31's names)."""
    return {
        "hosts": f.hosts,
        "pods_seconds": round(f.seconds_to_all_pods, 2),
        "pods_seconds_at_50ms": round(f.seconds_to_all_pods_at_50ms, 2),
        "cpu_ms_per_pod": round(f.cpu_ms_per_pod, 3),
        "restart_serving_seconds": round(f.restart_seconds, 2),
        "restart_replaced_seconds": round(f.restart_replaced_seconds, 2),
        "peak_rss_mib": round(
            max(f.operator_peak_mib, f.operator_peak_mib_deleted, f.operator_peak_mib_restart)
        ),
        "writes_per_hot_swap": f.hot_swap_writes,
        "requests_per_pod": round(f.requests_per_pod, 3),
    }

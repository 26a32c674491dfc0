"""Benchmark of the CPU one mutual TLS 1.3 handshake costs each side, with a job's credentials.

Why: a new leader accepts a connection from every member of the job (a hand-over, the first
registration), each a full handshake on the leader's one event loop, so its CPU per handshake times
the job's hosts bounds how fast a 25,000-host job is led again (benchmarks/control_plane_scale.py
measures the whole hand-over; this prices its largest part alone). The handshakes run in memory
(`ssl.MemoryBIO`, no socket, no event loop), so only OpenSSL's work and Python's calls into it are
timed, by the process's CPU clock, on each side apart.

Variants, interleaved round by round so that a busy machine slows each alike:
- `job`: the contexts every supervisor uses (`slicekeeper.credentials.server_context` /
  `client_context`);
- `job + tickets`: the same with the server issuing OpenSSL's default 2 session tickets (what the
  job's server did before it issued none);
- `job, no client check`: the server not asking for the client's certificate, to show what checking
  it costs (never used: a job's servers refuse a client without the job's certificate).

    .venv/bin/python -m benchmarks.tls_handshake [--handshakes 400] [--rounds 3]

Prints a table of milliseconds of CPU per handshake (median over rounds) and one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slicekeeper import credentials

Contexts = tuple[ssl.SSLContext, ssl.SSLContext]
OPENSSL_DEFAULT_TICKETS = 2


def job_contexts(directory: Path) -> Contexts:
    return credentials.server_context(directory), credentials.client_context(directory)


def with_tickets(directory: Path) -> Contexts:
    server, client = job_contexts(directory)
    server.num_tickets = OPENSSL_DEFAULT_TICKETS
    return server, client


def without_client_check(directory: Path) -> Contexts:
    server, client = job_contexts(directory)
    server.verify_mode = ssl.CERT_NONE
    return server, client


VARIANTS: dict[str, Callable[[Path], Contexts]] = {
    "job": job_contexts,
    "job + tickets": with_tickets,
    "job, no client check": without_client_check,
}


def handshake_cpu(contexts: Contexts, handshakes: int) -> tuple[float, float]:
    """Milliseconds of CPU per handshake on the server's side and the client's, each completed
    handshake followed by the client's read of what the server sent after it (its tickets, if any)."""
    server_context, client_context = contexts
    server_seconds = client_seconds = 0.0
    for _ in range(handshakes):
        to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        server = server_context.wrap_bio(to_server, from_server, server_side=True)
        client = client_context.wrap_bio(to_client, from_client, server_side=False)
        server_done = client_done = False
        while not (server_done and client_done):
            if not client_done:
                started = time.process_time()
                client_done = _step(client.do_handshake)
                client_seconds += time.process_time() - started
            to_server.write(from_client.read())
            if not server_done:
                started = time.process_time()
                server_done = _step(server.do_handshake)
                server_seconds += time.process_time() - started
            to_client.write(from_server.read())
        started = time.process_time()
        _step(functools.partial(client.read, 1))  # the post-handshake messages: session tickets
        client_seconds += time.process_time() - started
        if client.version() != "TLSv1.3":
            raise SystemExit(f"the handshake spoke {client.version()}, not TLS 1.3")
    return 1000 * server_seconds / handshakes, 1000 * client_seconds / handshakes


def _step(call: Callable[[], object]) -> bool:
    try:
        call()
    except ssl.SSLWantReadError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handshakes", type=int, default=400, help="handshakes per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        directory = credentials.generate("bench").write(Path(work) / "credentials")
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        for round_ in range(args.rounds):
            for name, make in VARIANTS.items():
                samples[name].append(handshake_cpu(make(directory), args.handshakes))
            print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    figures = {
        name: {
            "server_ms": round(statistics.median(s for s, _ in runs), 3),
            "client_ms": round(statistics.median(c for _, c in runs), 3),
        }
        for name, runs in samples.items()
    }
    print(f"{'variant':<24}{'server ms/handshake':>22}{'client ms/handshake':>22}")
    for name, figure in figures.items():
        print(f"{name:<24}{figure['server_ms']:>22.3f}{figure['client_ms']:>22.3f}")
    print(json.dumps({"openssl": ssl.OPENSSL_VERSION, "handshakes": args.handshakes, **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

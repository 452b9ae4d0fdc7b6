"""Per-request overhead of a sidecar reached over a socket, against a piped one.

Three fake sidecars run side by side: one spawned by the client (pipes, the default),
one listening on a Unix socket and one on loopback TCP (both with a token).  Each round
sends ``--requests`` requests one after another to each of them in turn (the order
reversed every other round), for two workloads: ``ping`` (a bare round trip) and a
``synthesize`` of one second of audio (48 KB at 24 kHz) in one chunk::

    .venv/bin/python bench/bench_remote.py --rounds 5

Prints, per workload and transport, the median time per request (median over rounds of
each round's median, with the min-max of the round medians) and the difference to pipes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from anyio.abc import Process

from indextts_client import Client

TOKEN = "bench-token-0123456789abcdef"


async def listening(directory: Path, listen: str) -> tuple[Process, str]:
    voices = directory / "voices"
    voices.mkdir(exist_ok=True)
    (directory / "token").write_text(TOKEN)
    command = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "WARNING"]
    command += ["--listen", listen, "--voice-dir", str(voices), "--token-file", str(directory / "token")]
    process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=None)
    assert process.stdout is not None
    line = b""
    with anyio.fail_after(30):
        while not line.endswith(b"\n"):
            line += await process.stdout.receive(1)
    return process, line.decode().strip().removeprefix("listening on ")


async def timed(call: Callable[[], Awaitable[object]], requests: int) -> float:
    """The median seconds of ``requests`` sequential calls."""
    times = []
    for _ in range(requests):
        began = time.perf_counter()
        await call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="itts-bench-") as tmp:
        directory = Path(tmp)
        unix_process, unix_url = await listening(directory, f"unix://{directory}/s.sock")
        tcp_process, tcp_url = await listening(directory, "tcp://127.0.0.1:0")
        clients = {
            "pipes": Client("fake"),
            "unix": Client(url=unix_url, token=TOKEN),
            "tcp": Client(url=tcp_url, token=TOKEN),
        }
        workloads: dict[str, Callable[[Client], Callable[[], Awaitable[object]]]] = {
            "ping": lambda c: c.ping,
            "synthesize 1 s": lambda c: lambda: c.synthesize("x", seconds=1.0, chunk_seconds=1.0),
        }
        results: dict[tuple[str, str], list[float]] = {(w, t): [] for w in workloads for t in clients}
        try:
            for client in clients.values():
                await client.start()
                await client.load()
            for number in range(args.rounds):
                order = list(clients) if number % 2 == 0 else list(reversed(clients))
                for workload, make in workloads.items():
                    for name in order:
                        call = make(clients[name])
                        await timed(call, 5)  # warm-up, not counted
                        results[workload, name].append(await timed(call, args.requests))
        finally:
            for client in clients.values():
                await client.aclose()
            for process in (unix_process, tcp_process):
                process.terminate()
                await process.wait()
                await process.aclose()
    print(f"{args.rounds} rounds of {args.requests} sequential requests per transport and workload")
    for workload in workloads:
        base = statistics.median(results[workload, "pipes"])
        print(f"  {workload}:")
        for name in clients:
            values = [v * 1e6 for v in results[workload, name]]
            median = statistics.median(values)
            print(
                f"    {name:5}: {median:7.0f} us per request ({min(values):.0f}-{max(values):.0f})"
                f"  {median - base * 1e6:+6.0f} us against pipes"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    anyio.run(main, parser.parse_args())

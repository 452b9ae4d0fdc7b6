"""Per-request overhead of a sidecar reached over a socket, against a piped one.

    .venv/bin/python bench/bench_remote.py [--rounds 5] [--requests 1000] [--warmup 1] [--hash-seed 1]

Three fake sidecars: one spawned by its client (pipes, the default), one listening on a
Unix socket and one on loopback TCP (both with a token, so each connection goes through
the challenge-response once).  Two workloads: ``ping`` (a bare round trip) and a
``synthesize`` of one second of audio (48 KB at 24 kHz) in one chunk.  Each round starts
every transport and workload afresh, in the rotating order, as bench_requests.py does its
contenders: the client in a process of its own with its sidecar, all with the round's
``PYTHONHASHSEED``, busy for ``--warmup`` seconds, then ``--requests`` requests one after
another, then closed.

Prints per workload and transport the time and the CPU of the client's process and of the
sidecar per request (median, min-max over the rounds), and each round's difference to
pipes.  Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_requests import REPO, Contender, Worker, interleave, stat, worker_options  # noqa: E402

WORKER = r"""
import json, subprocess, sys, tempfile, time
from pathlib import Path
import anyio
from indextts_client import Client

TOKEN = "bench-token-0123456789abcdef"

async def listening(directory, listen):
    (directory / "token").write_text(TOKEN)
    (directory / "voices").mkdir()
    command = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "WARNING",
               "--listen", listen, "--token-file", str(directory / "token"), "--voice-dir", str(directory / "voices")]
    process = await anyio.open_process(command, stdin=subprocess.DEVNULL, stderr=None)
    line = b""
    with anyio.fail_after(30):
        while not line.endswith(b"\n"):
            line += await process.stdout.receive(1)
    return process, line.decode().strip().removeprefix("listening on ")

async def main():
    transport, op = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="itts-bench-") as tmp:
        directory, server = Path(tmp), None
        if transport == "pipes":
            client = Client("fake")
        else:
            listen = f"unix://{directory}/s.sock" if transport == "unix" else "tcp://127.0.0.1:0"
            server, url = await listening(directory, listen)
            client = Client(url=url, token=TOKEN)
        try:
            async with client:
                await client.load()
                if op == "ping":
                    request = client.ping
                else:
                    async def request():
                        audio = await client.synthesize("x", seconds=1.0, chunk_seconds=1.0)
                        assert len(audio.samples) == 24000, len(audio.samples)
                print(json.dumps({"ready": client.pid if server is None else server.pid}), flush=True)
                for line in sys.stdin:
                    count = int(line.split()[0])
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    for _ in range(count):
                        await request()
                    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                    print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)
        finally:
            if server is not None:
                server.terminate()
                await server.wait()
                await server.aclose()

anyio.run(main)
"""

TRANSPORTS = ("pipes", "unix", "tcp")
WORKLOADS = {"ping": "ping", "synthesize": "synthesize 1 s"}


def transport(name: str, op: str, args: argparse.Namespace) -> Contender:
    """A client and its sidecar over ``name`` (pipes, unix, tcp), in a worker process."""
    command = [sys.executable, "-c", WORKER, name, op]
    label = f"{op} {name}"
    return label, lambda seed: Worker(label, command, REPO, seed, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000)
    worker_options(parser)
    args = parser.parse_args()
    args.in_flight = 1
    contenders = [transport(name, op, args) for op in WORKLOADS for name in TRANSPORTS]
    rows, _ = interleave(contenders, args)
    n = args.requests
    print(f"{args.rounds} rounds x {n} sequential requests per transport and workload; median (min-max):")
    print(
        f"{'':24} {'per request (us)':>18} {'against pipes (us)':>20}"
        f" {'client CPU/req (us)':>21} {'sidecar CPU/req (us)':>22}"
    )
    for op, title in WORKLOADS.items():
        pipes = [wall / n for wall, _, _ in rows[f"{op} pipes"]]
        for name in TRANSPORTS:
            values = rows[f"{op} {name}"]
            times = [wall / n for wall, _, _ in values]
            extra = [a - b for a, b in zip(times, pipes, strict=True)]
            print(
                f"{title + ', ' + name:24} {stat(times, 1e6):>18} {stat(extra, 1e6):>20}"
                f" {stat([cpu / n for _, cpu, _ in values], 1e6):>21}"
                f" {stat([cpu / n for _, _, cpu in values], 1e6):>22}"
            )


if __name__ == "__main__":
    main()

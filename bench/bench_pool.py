"""Aggregate throughput of a Pool of 1, 2 and 4 fake sidecars, measured side by side.

    .venv/bin/python bench/bench_pool.py [--rounds 5] [--requests 40] [--in-flight 16]
        [--compute 0.05] [--seconds 1] [--sizes 1,2,4] [--warmup 1] [--hash-seed 1]
    .venv/bin/python bench/bench_pool.py --compute 0 --seconds 10 --requests 2000   # CPU-bound

Each request simulates ``--compute`` seconds of inference (the fake engine's ``delay``,
a sleep: like a GPU, it leaves the CPU free) and returns ``--seconds`` of audio in one
chunk, ``--in-flight`` requests at a time.  Each round starts every pool afresh, in the
rotating order, as bench_requests.py does its contenders: the parent in a process of its
own with its sidecars, all with the round's ``PYTHONHASHSEED``, busy for ``--warmup``
seconds, then ``--requests`` requests, then closed.

Prints per pool size the requests per second and the CPU per request of the parent and of
all its sidecars together (median, min-max over the rounds), and each round's ratio to one
sidecar.  Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_requests import REPO, Contender, Worker, interleave, ratios, stat, worker_options  # noqa: E402

WORKER = r"""
import json, sys, time
import anyio
from indextts_client import Pool

async def main():
    settings = json.loads(sys.argv[1])
    seconds, compute = settings["seconds"], settings["compute"]
    samples = round(seconds * 24000)
    pool = Pool("fake", size=settings["size"], max_outstanding=settings["in_flight"], pool_timeout=None)
    async with pool:
        await pool.load()
        print(json.dumps({"ready": [member.pid for member in pool.members]}), flush=True)
        for line in sys.stdin:
            count, in_flight = map(int, line.split())
            limit = anyio.Semaphore(in_flight)

            async def one():
                async with limit:
                    audio = await pool.synthesize("x", seconds=seconds, chunk_seconds=seconds, delay=compute)
                    assert len(audio.samples) == samples, len(audio.samples)

            cpu0, wall0 = time.process_time(), time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(one)
            print(json.dumps({"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0}), flush=True)

anyio.run(main)
"""


def pool(size: int, args: argparse.Namespace) -> Contender:
    """A Pool of ``size`` fake sidecars, its parent in a worker process."""
    settings = json.dumps({"size": size, "in_flight": args.in_flight, "seconds": args.seconds, "compute": args.compute})
    command = [sys.executable, "-c", WORKER, settings]
    name = f"{size} sidecar(s)"
    return name, lambda seed: Worker(name, command, REPO, seed, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--compute", type=float, default=0.05, help="simulated inference per request, a sleep")
    parser.add_argument("--seconds", type=float, default=1.0, help="audio per request, in one chunk")
    worker_options(parser)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    rows, _ = interleave([pool(size, args) for size in sizes], args)
    n = args.requests
    print(
        f"{args.rounds} rounds x {n} requests of {args.compute * 1000:g} ms compute and {args.seconds:g} s of audio, "
        f"{args.in_flight} in flight, {os.cpu_count()} CPUs; median (min-max):"
    )
    cpu = f"{'parent CPU/req (us)':>22} {'sidecars CPU/req (us)':>23}"
    print(f"{'':16} {'requests/s':>22} {'vs one sidecar':>16} {cpu}")
    base = [n / wall for wall, _, _ in rows[f"{sizes[0]} sidecar(s)"]]
    for name, values in rows.items():
        rates = [n / wall for wall, _, _ in values]
        parent = [cpu / n for _, cpu, _ in values]
        children = [cpu / n for _, _, cpu in values]
        print(
            f"{name:16} {stat(rates, 1, 1):>22} {ratios(rates, base):>16}"
            f" {stat(parent, 1e6):>22} {stat(children, 1e6):>23}"
        )


if __name__ == "__main__":
    main()

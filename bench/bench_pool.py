"""Aggregate throughput of a Pool of 1, 2 and 4 fake sidecars, measured side by side.

Each request simulates ``--compute`` seconds of inference (the fake engine's ``delay``,
a sleep: like a GPU, it leaves the CPU free) and returns ``--seconds`` of audio in one
chunk.  The pools run in turn, round after round, with ``--concurrency`` requests in flight::

    .venv/bin/python bench/bench_pool.py --rounds 3
    .venv/bin/python bench/bench_pool.py --compute 0 --seconds 10 --requests 400   # CPU-bound

Prints requests per second per pool size (median, min-max) and the ratio to one sidecar.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import anyio

from indextts_client import Pool


async def burst(pool: Pool, requests: int, concurrency: int, compute: float, seconds: float) -> float:
    limit = anyio.Semaphore(concurrency)

    async def one() -> None:
        async with limit:
            await pool.synthesize("x", seconds=seconds, chunk_seconds=seconds, delay=compute)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(requests):
            tg.start_soon(one)
    return requests / (time.perf_counter() - started)


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    pools = {size: Pool("fake", size=size, max_outstanding=args.concurrency, pool_timeout=None) for size in sizes}
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    try:
        for pool in pools.values():
            await pool.start()
            await pool.load()
        for number in range(args.rounds):
            order = sizes if number % 2 == 0 else list(reversed(sizes))
            for size in order:
                rates[size].append(
                    await burst(pools[size], args.requests, args.concurrency, args.compute, args.seconds)
                )
    finally:
        for pool in pools.values():
            await pool.aclose()
    base = statistics.median(rates[sizes[0]])
    print(
        f"{args.requests} requests of {args.compute * 1000:.0f} ms compute and {args.seconds:g} s of audio, "
        f"{args.concurrency} in flight, {os.cpu_count()} CPUs:"
    )
    for size in sizes:
        values = rates[size]
        print(
            f"  {size} sidecar(s): {statistics.median(values):7.1f} req/s ({min(values):.1f}-{max(values):.1f})"
            f"  {statistics.median(values) / base:.2f}x one sidecar"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--compute", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=1.0, help="audio per request")
    anyio.run(main, parser.parse_args())

"""The sidecar's batching across requests, measured with the fake engine: c requests at once
into one sidecar whose engine batches (``max_batch``) against the same sidecar without.

    .venv/bin/python bench/bench_batch.py [--rounds 5] [--concurrency 1,2,4,8] [--max-batch 8]
        [--compute 0.02] [--seconds 1] [--chunk 0.1] [--batch-wait-ms 0]

Each request makes ``--seconds`` of audio in chunks of ``--chunk`` seconds, and each chunk
costs ``--compute`` seconds of simulated inference (the fake engine's ``delay``, a sleep
that leaves the CPU free, as a GPU does).  Batched, the fake engine pays that once per step
for the whole batch, as a GPU decoding a batch at memory-bound speed roughly does: the
bench measures what the scheduler makes of it (the picking, the per-request frames,
resampling none, the parent's reading), not a model.

Two sidecars run side by side for the whole bench (one ``-o max_batch=N``, one without),
loaded and warmed; each round runs every c on both, in an order that rotates per round.
Printed per c: aggregate audio seconds per wall second for each, their ratio (batched over
unbatched, per round), the batched throughput over one lone request's (the issue's
``throughput_ratio``), and the first audio's wait against a lone request's; median
(min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import anyio

from indextts_client import Client

RATE = 24000


def _stat(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


async def _burst(client: Client, count: int, options: dict[str, Any]) -> tuple[float, float]:
    """``count`` requests at once: (wall seconds until the last ended, median first-audio seconds)."""
    firsts: list[float] = []
    began = time.perf_counter()

    async def one() -> None:
        async with client.stream("batch bench", **options) as chunks:
            first = True
            async for _chunk in chunks:
                if first:
                    firsts.append(time.perf_counter() - began)
                    first = False

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return time.perf_counter() - began, statistics.median(firsts)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    options = {"seconds": args.seconds, "chunk_seconds": args.chunk, "delay": args.compute}
    engine = {"sample_rate": RATE}
    results: dict[str, dict[int, list[tuple[float, float]]]] = {"batched": {}, "unbatched": {}}
    async with (
        Client(
            "fake",
            engine_options={**engine, "max_batch": args.max_batch},
            sidecar_args=["--batch-wait-ms", str(args.batch_wait_ms)],
        ) as batched,
        Client("fake", engine_options=engine) as unbatched,
    ):
        clients = {"batched": batched, "unbatched": unbatched}
        assert batched.info.max_batch == args.max_batch and unbatched.info.max_batch == 1
        for client in clients.values():
            await client.load()
            await _burst(client, max(levels), options)  # warm-up
        names = list(clients)
        for round_index in range(args.rounds):
            for level in levels:
                order = names[round_index % 2 :] + names[: round_index % 2]
                for name in order:
                    results[name].setdefault(level, []).append(await _burst(clients[name], level, options))
    report: dict[str, Any] = {"settings": vars(args), "levels": {}}
    lone = {name: [wall for wall, _ in results[name][levels[0]]] for name in names}
    lone_first = [first for _, first in results["unbatched"][levels[0]]]
    print(
        f"{'c':>3} {'batched a-s/s':>20} {'unbatched a-s/s':>20} {'batched/unbatched':>20} "
        f"{'batched/lone':>20} {'first audio/lone':>20}"
    )
    for level in levels:
        rates = {name: [level * args.seconds / wall for wall, _ in results[name][level]] for name in names}
        ratio = [b / u for b, u in zip(rates["batched"], rates["unbatched"], strict=True)]
        # Against one lone request's rate in the same round (the unbatched sidecar's c=1).
        over_lone = [
            rate / (args.seconds / alone) for rate, alone in zip(rates["batched"], lone["unbatched"], strict=True)
        ]
        first_ratio = [first / alone for (_, first), alone in zip(results["batched"][level], lone_first, strict=True)]
        print(
            f"{level:>3} {_stat(rates['batched']):>20} {_stat(rates['unbatched']):>20} {_stat(ratio):>20} "
            f"{_stat(over_lone):>20} {_stat(first_ratio):>20}"
        )
        report["levels"][level] = {
            "batched_audio_per_second": rates["batched"],
            "unbatched_audio_per_second": rates["unbatched"],
            "batched_over_unbatched": ratio,
            "batched_over_lone": over_lone,
            "first_audio_over_lone": first_ratio,
        }
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--compute", type=float, default=0.02, help="seconds of simulated compute per step")
    parser.add_argument("--seconds", type=float, default=1.0, help="audio per request")
    parser.add_argument("--chunk", type=float, default=0.1, help="audio per chunk (one step)")
    parser.add_argument("--batch-wait-ms", type=float, default=0.0, help="the batched sidecar's --batch-wait-ms")
    parser.add_argument("--json", help="also write the figures to this file")
    namespace = parser.parse_args()
    figures = anyio.run(main, namespace)
    if namespace.json:
        with open(namespace.json, "w") as file:
            json.dump(figures, file, indent=2)

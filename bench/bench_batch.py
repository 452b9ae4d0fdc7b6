"""The sidecar's batching across requests, measured with the fake engine: c requests at once
into one sidecar whose engine batches (``max_batch``) against another sidecar.

    .venv/bin/python bench/bench_batch.py [--rounds 5] [--concurrency 1,2,4,8] [--max-batch 8]
        [--compute 0.02] [--seconds 1] [--chunk 0.1] [--batch-wait-ms 0]
        [-o KEY=VALUE ...] [--against unbatched|batched]

Each request makes ``--seconds`` of audio in chunks of ``--chunk`` seconds, and each chunk
costs ``--compute`` seconds of simulated inference (the fake engine's ``delay``, a sleep
that leaves the CPU free, as a GPU does).  Batched, the fake engine pays that once per step
for the whole batch, as a GPU decoding a batch at memory-bound speed roughly does: the
bench measures what the scheduler makes of it (the picking, the per-request frames,
resampling none, the parent's reading), not a model.

Two sidecars run side by side for the whole bench, loaded and warmed: the batched one
(``-o max_batch=N`` and each ``-o`` given here, e.g. ``-o join_batches=true``) and the other:
``--against unbatched`` (default) the same without batching; ``--against batched`` the same
``max_batch`` and ``--batch-wait-ms`` without the ``-o`` options (continuous batching against
batches fixed once they start).  Each round runs every c on both, in an order that rotates
per round.  Each request of c leaves the client in a write of its own.

Printed per c: aggregate audio seconds per wall second for each, their ratio (batched over
the other, per round), the batched throughput over one lone request's (the other sidecar's
first c; the issue's ``throughput_ratio``), the median and the slowest request's first audio
against a lone request's, and for each batching sidecar how many bursts split: did not start
as one batch (a request that ran alone or in a smaller batch, or that joined a running one
after its first step),
read from the fake engine's ``record`` of each request, and what a split costs: the split
bursts' throughput over the median unsplit burst's.  Median (min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from indextts_client import Client
from indextts_sidecar.protocol.options import parse_options

RATE = 24000


def _stat(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


class _Burst:
    """One burst's figures: wall seconds, each request's first audio, and whether it split."""

    def __init__(self, wall: float, firsts: list[float], split: bool) -> None:
        self.wall = wall
        self.first = statistics.median(firsts)
        self.slowest = max(firsts)
        self.split = split


async def _burst(client: Client, count: int, options: dict[str, Any], records: Path | None) -> _Burst:
    """``count`` requests at once, each in a write of its own."""
    firsts: list[float] = []
    paths = [records / f"{index}.json" for index in range(count)] if records is not None else []
    began = time.perf_counter()

    async def one(index: int) -> None:
        extra = {"record": str(paths[index])} if paths else {}
        async with client.stream("batch bench", **options, **extra) as chunks:
            first = True
            async for _chunk in chunks:
                if first:
                    firsts.append(time.perf_counter() - began)
                    first = False

    async with anyio.create_task_group() as tg:
        for index in range(count):
            tg.start_soon(one, index)
    wall = time.perf_counter() - began
    split = False
    if count > 1 and paths:
        for path in paths:
            received = json.loads(path.read_bytes())
            # Joined after the batch's first step, or ran alone or in a smaller batch.
            if received.get("joined", 0) >= 1 or len(received.get("batch", ())) < count:
                split = True
    return _Burst(wall, firsts, split)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    options = {"seconds": args.seconds, "chunk_seconds": args.chunk, "delay": args.compute}
    engine = {"sample_rate": RATE}
    extra = parse_options(args.option)
    wait = ["--batch-wait-ms", str(args.batch_wait_ms)]
    other_engine = {**engine, "max_batch": args.max_batch} if args.against == "batched" else engine
    results: dict[str, dict[int, list[_Burst]]] = {"batched": {}, "other": {}}
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as scratch:
        async with (
            Client(
                "fake", engine_options={**engine, "max_batch": args.max_batch, **extra}, sidecar_args=wait
            ) as batched,
            Client(
                "fake", engine_options=other_engine, sidecar_args=wait if args.against == "batched" else []
            ) as other,
        ):
            clients = {"batched": batched, "other": other}
            assert batched.info.max_batch == args.max_batch
            # Records tell the splits of a batching sidecar; an unbatched one writes none.
            records = {name: Path(scratch) / name for name in clients if clients[name].info.max_batch > 1}
            for name, client in clients.items():
                if name in records:
                    records[name].mkdir()
                await client.load()
                await _burst(client, max(levels), options, records.get(name))  # warm-up
            names = list(clients)
            for round_index in range(args.rounds):
                for level in levels:
                    order = names[round_index % 2 :] + names[: round_index % 2]
                    for name in order:
                        burst = await _burst(clients[name], level, options, records.get(name))
                        results[name].setdefault(level, []).append(burst)
    return _report(args, levels, results)


def _split_cost(bursts: list[_Burst], rates: list[float]) -> str:
    """The split bursts' throughput over the median unsplit burst's: median (min-max), or "-"."""
    whole = [rate for burst, rate in zip(bursts, rates, strict=True) if not burst.split]
    split = [rate for burst, rate in zip(bursts, rates, strict=True) if burst.split]
    if not split or not whole:
        return "-"
    return _stat([rate / statistics.median(whole) for rate in split])


def _report(args: argparse.Namespace, levels: list[int], results: dict[str, dict[int, list[_Burst]]]) -> dict[str, Any]:
    names = ["batched", "other"]
    report: dict[str, Any] = {"settings": vars(args), "levels": {}}
    lone = [burst.wall for burst in results["other"][levels[0]]]
    lone_first = [burst.first for burst in results["other"][levels[0]]]
    print(f"the other sidecar: {args.against}; -o {' '.join(args.option) or '(none)'}")
    print(
        f"{'c':>3} {'batched a-s/s':>20} {'other a-s/s':>20} {'batched/other':>18} {'batched/lone':>18} "
        f"{'first/lone':>18} {'slowest first/lone':>20} {'other slowest':>18} {'splits':>7} "
        f"{'split a-s/s, batched':>18} {'split a-s/s, other':>18}"
    )
    for level in levels:
        bursts = {name: results[name][level] for name in names}
        rates = {name: [level * args.seconds / burst.wall for burst in bursts[name]] for name in names}
        ratio = [b / u for b, u in zip(rates["batched"], rates["other"], strict=True)]
        # Against one lone request's rate in the same round (the other sidecar's first c).
        over_lone = [rate / (args.seconds / alone) for rate, alone in zip(rates["batched"], lone, strict=True)]
        first = {
            name: [burst.first / alone for burst, alone in zip(bursts[name], lone_first, strict=True)] for name in names
        }
        slowest = {
            name: [burst.slowest / alone for burst, alone in zip(bursts[name], lone_first, strict=True)]
            for name in names
        }
        splits = {name: sum(burst.split for burst in bursts[name]) for name in names}
        shown = f"{splits['batched']}/{splits['other']}" if args.against == "batched" else str(splits["batched"])
        cost = {name: _split_cost(bursts[name], rates[name]) for name in names}
        print(
            f"{level:>3} {_stat(rates['batched']):>20} {_stat(rates['other']):>20} {_stat(ratio):>18} "
            f"{_stat(over_lone):>18} {_stat(first['batched']):>18} {_stat(slowest['batched']):>20} "
            f"{_stat(slowest['other']):>18} {shown:>7} {cost['batched']:>18} {cost['other']:>18}"
        )
        report["levels"][level] = {
            "batched_audio_per_second": rates["batched"],
            "other_audio_per_second": rates["other"],
            "batched_over_other": ratio,
            "batched_over_lone": over_lone,
            "first_audio_over_lone": first["batched"],
            "slowest_first_audio_over_lone": slowest["batched"],
            "other_slowest_first_audio_over_lone": slowest["other"],
            "splits": splits,
            "batched_split": [burst.split for burst in bursts["batched"]],
            "other_split": [burst.split for burst in bursts["other"]],
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
    parser.add_argument("--batch-wait-ms", type=float, default=0.0, help="the batching sidecars' --batch-wait-ms")
    parser.add_argument(
        "-o", "--option", action="append", default=[], help="an engine option of the batched sidecar, KEY=VALUE"
    )
    parser.add_argument(
        "--against",
        choices=["unbatched", "batched"],
        default="unbatched",
        help="the other sidecar: without batching, or batching as the first without its -o options",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    namespace = parser.parse_args()
    figures = anyio.run(main, namespace)
    if namespace.json:
        with open(namespace.json, "w") as file:
            json.dump(figures, file, indent=2)

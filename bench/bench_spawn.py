"""From spawn to the first answer, and to one second of audio: this project against the seed's protocol.

    .venv/bin/python bench/bench_spawn.py [--rounds 7]

Each round spawns a fresh child per measure and contender, the order rotating between
rounds: the time from spawning to an answered ping, and from spawning to one second of
audio in the parent (fake engine, zero model time; the seed's parent spawns its server and
asks, as the seed does).  Ours is ``async with Client("fake")`` on asyncio, which includes
the client's own start-up work.  Prints medians (min-max) and the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import anyio

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_protocol import SeedParent  # noqa: E402

from indextts_client import Client  # noqa: E402


async def _ours(audio: bool) -> float:
    began = time.perf_counter()
    async with Client("fake") as client:
        if audio:
            assert len((await client.synthesize("benchmark", seconds=1.0)).samples) == 24000
        else:
            await client.ping()
        return time.perf_counter() - began


def _seed(audio: bool) -> float:
    began = time.perf_counter()
    parent = SeedParent()
    if audio:
        assert len(parent.synthesize(1.0)) == 24000
    else:
        parent.send({"op": "ping"})
        assert parent.receive()["op"] == "pong"
    elapsed = time.perf_counter() - began
    parent.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    contenders: dict[str, Callable[[bool], float]] = {
        "seed": _seed,
        "ours": lambda audio: anyio.run(_ours, audio),
    }
    times: dict[tuple[str, bool], list[float]] = {(name, audio): [] for name in contenders for audio in (False, True)}
    for number in range(args.rounds):
        names = list(contenders) if number % 2 == 0 else list(reversed(contenders))
        for audio in (False, True):
            for name in names:
                times[name, audio].append(contenders[name](audio))

    def stat(values: list[float], scale: float = 1e3, digits: int = 1) -> str:
        return (
            f"{statistics.median(values) * scale:.{digits}f} "
            f"({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
        )

    print(f"{args.rounds} rounds, a fresh child per measure; median (min-max)")
    print(f"{'':28} {'seed (ms)':>22} {'ours (ms)':>22} {'ours / seed':>18}")
    for audio, label in ((False, "spawn -> answered ping"), (True, "spawn -> 1 s of audio")):
        seed, ours = times["seed", audio], times["ours", audio]
        ratios = [a / b for a, b in zip(ours, seed, strict=True)]
        print(f"{label:28} {stat(seed):>22} {stat(ours):>22} {stat(ratios, 1, 2):>18}")


if __name__ == "__main__":
    main()

"""From spawn to the first answer, and to one second of audio: this project against the seed's protocol.

    .venv/bin/python bench/bench_spawn.py [--rounds 7] [--before CHECKOUT]

Each round spawns a fresh child per measure and contender, the order reversed every other
round: the time from spawning to its ``ready`` (ours: ``async with Client`` entered; the
floor: its ``R``), to an answered ping, and from spawning to one second of audio in the
parent (fake engine, zero model time; the seed's parent spawns its server and asks, as the
seed does).  Ours is ``async with Client("fake")`` on asyncio, which includes the client's
own start-up work.  The asyncio floor (``_loop_floor_server.py``) is the least an asyncio
sidecar speaking the same frames does: its interpreter, asyncio and msgspec imports, one
readiness callback.  Prints medians (min-max) and the per-round ratios.  ``--before``
(another checkout, e.g. a git worktree) adds ours with that checkout's sidecar, taking
turns with the others, and the ratio of this checkout's times to its (see ``_checkouts.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Union

import anyio
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _checkouts import add_before, compile_checkouts  # noqa: E402
from _yardsticks import SeedParent, spawn_server  # noqa: E402

from indextts_client import Client  # noqa: E402


async def _ours(audio: bool, repo: str) -> tuple[float, float]:
    began = time.perf_counter()
    async with Client("fake", env={"PYTHONPATH": repo}, cwd=repo) as client:
        ready = time.perf_counter() - began
        if audio:
            assert len((await client.synthesize("benchmark", seconds=1.0)).samples) == 24000
        else:
            await client.ping()
        return ready, time.perf_counter() - began


def _seed(audio: bool) -> tuple[float, float]:
    """(spawn -> ready, spawn -> the answer)."""
    began = time.perf_counter()
    parent = SeedParent()
    ready = time.perf_counter() - began
    if audio:
        assert len(parent.synthesize(1.0)) == 24000
    else:
        parent.send({"op": "ping"})
        assert parent.receive()["op"] == "pong"
    elapsed = time.perf_counter() - began
    parent.close()
    return ready, elapsed


def _loop_floor(audio: bool) -> tuple[float, float]:
    """``_loop_floor_server.py``: an asyncio sidecar that does the least (see there); a blocking parent."""
    from indextts_sidecar import protocol

    began = time.perf_counter()
    process = spawn_server("_loop_floor_server.py")
    ready = time.perf_counter() - began
    assert process.stdin is not None and process.stdout is not None
    if audio:
        process.stdin.write(protocol.frame(protocol.Synthesize(id=1, text="x", options={"seconds": 1.0})))
    else:
        process.stdin.write(protocol.frame(protocol.Ping(id=1)))
    samples = 0
    while True:
        size = int.from_bytes(process.stdout.read(4), "big")
        reply = protocol.decode_reply(process.stdout.read(size))
        if isinstance(reply, protocol.Audio):
            samples += len(np.frombuffer(reply.pcm, dtype="<i2").copy())
        elif isinstance(reply, (protocol.Done, protocol.Pong)):
            break
    assert samples == (24000 if audio else 0)
    elapsed = time.perf_counter() - began
    process.stdin.close()
    process.wait(10)
    process.stdout.close()
    return ready, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    add_before(parser)
    args = parser.parse_args()
    here = os.path.dirname(HERE)
    contenders: dict[str, Callable[[bool], tuple[float, float]]] = {
        "seed": _seed,
        "ours": lambda audio: anyio.run(_ours, audio, here),
        "asyncio floor": _loop_floor,
    }
    compile_checkouts(here, *([args.before] if args.before else []))
    if args.before:
        contenders["before"] = lambda audio: anyio.run(_ours, audio, args.before)
    # Keys: (contender, None) spawn -> ready (of the ping measures), (contender, audio) spawn -> the answer.
    times: dict[tuple[str, Union[bool, None]], list[float]] = {
        (name, audio): [] for name in contenders for audio in (None, False, True)
    }
    for number in range(args.rounds):
        names = list(contenders) if number % 2 == 0 else list(reversed(contenders))
        for audio in (False, True):
            for name in names:
                ready, answered = contenders[name](audio)
                times[name, audio].append(answered)
                if not audio:
                    times[name, None].append(ready)

    def stat(values: list[float], scale: float = 1e3, digits: int = 1) -> str:
        return (
            f"{statistics.median(values) * scale:.{digits}f} "
            f"({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
        )

    print(f"{args.rounds} rounds, a fresh child per measure; median (min-max)")
    print(
        f"{'':24} {'seed (ms)':>20} {'ours (ms)':>20} {'ours / seed':>17}"
        f" {'asyncio floor (ms)':>20} {'floor / seed':>17}"
    )
    rows: tuple[tuple[Union[bool, None], str], ...] = (
        (None, "spawn -> ready"),
        (False, "spawn -> answered ping"),
        (True, "spawn -> 1 s of audio"),
    )
    for audio, label in rows:
        seed, ours, floor = times["seed", audio], times["ours", audio], times["asyncio floor", audio]
        ours_ratios = [a / b for a, b in zip(ours, seed, strict=True)]
        floor_ratios = [a / b for a, b in zip(floor, seed, strict=True)]
        print(
            f"{label:24} {stat(seed):>20} {stat(ours):>20} {stat(ours_ratios, 1, 2):>17}"
            f" {stat(floor):>20} {stat(floor_ratios, 1, 2):>17}"
        )
    if args.before:
        print(f"\n{'':24} {'before (ms)':>20} {'ours (ms)':>20} {'ours / before':>17}")
        for audio, label in rows:
            before, ours = times["before", audio], times["ours", audio]
            print(
                f"{label:24} {stat(before):>20} {stat(ours):>20}"
                f" {stat([a / b for a, b in zip(ours, before, strict=True)], 1, 2):>17}"
            )


if __name__ == "__main__":
    main()

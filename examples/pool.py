"""Several sidecars behind one API: concurrent requests spread over a Pool.

    python examples/pool.py [ENGINE] [SIZE]     (default: espeak, 2)

On a machine with GPUs, ``Pool("indextts2", devices=["cuda:0", "cuda:1"], python=...)``
pins one sidecar to each GPU instead.
"""

from __future__ import annotations

import sys

import anyio

from indextts_client import Pool

LINES = [
    "The first line.",
    "A second line, spoken beside the first.",
    "A third one.",
    "And a fourth, to keep both sidecars busy.",
]


async def main(engine: str, size: int) -> None:
    async with Pool(engine, size=size) as pool:
        results: dict[int, float] = {}

        async def speak(index: int, line: str) -> None:
            audio = await pool.synthesize(line)
            results[index] = audio.duration

        async with anyio.create_task_group() as tg:
            for index, line in enumerate(LINES):
                tg.start_soon(speak, index, line)
        for index in sorted(results):
            print(f"line {index}: {results[index]:.2f} s of audio")
        for member in await pool.health():
            print(f"sidecar {member.index} (pid {member.pid}): served {member.served}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "espeak", int(sys.argv[2]) if len(sys.argv) > 2 else 2)

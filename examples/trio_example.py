"""The same client under trio: trio's nursery and cancel scopes work as anyio's do.

::

    pip install trio
    python examples/trio_example.py           # the fake engine
    python examples/trio_example.py espeak    # real speech (needs indextts-sidecar[espeak])
"""

from __future__ import annotations

import sys

import anyio
import trio

from indextts_client import Client, ProgressEvent


async def report(event: ProgressEvent) -> None:
    # An async progress callback: awaited in the task that runs the request.
    if event.stage == "load" and event.fraction == 1.0:
        print("model loaded")
    await trio.lowlevel.checkpoint()  # stands for real async work, e.g. a websocket send


async def main(engine: str) -> None:
    async with Client(engine) as client:
        audio = await client.synthesize("Hello from trio.", on_progress=report)
        print(f"synthesize: {len(audio)} samples at {audio.sample_rate} Hz")

        # Leaving the ``async with`` early cancels the rest of the request on the sidecar.
        async with client.stream("One. Two. Three. Four. Five.") as chunks:
            async for chunk in chunks:
                print(f"first chunk: {len(chunk)} samples; stopping here")
                break

        results: list[int] = []

        async def one(text: str) -> None:
            results.append(len(await client.synthesize(text)))

        async with trio.open_nursery() as nursery:
            for text in ("first", "second", "third"):
                nursery.start_soon(one, text)
        print(f"three concurrent requests: {sorted(results)} samples")

        slow = {"delay": 0.05} if engine == "fake" else {}  # fake: 0.05 s of "compute" per chunk
        with trio.move_on_after(0.01) as scope:
            await client.synthesize("A request given up after ten milliseconds. " * 20, **slow)
        print(f"given up: {scope.cancelled_caught}")
        health = await client.ping()
        print(f"ping after a cancel: loaded={health.loaded}, round trip {health.round_trip * 1000:.1f} ms")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "fake", backend="trio")

"""Stream a request's audio chunk by chunk, with a progress callback.

::

    python examples/stream_with_progress.py          # the fake engine (no dependencies)
    python examples/stream_with_progress.py espeak   # real speech (needs indextts-sidecar[espeak])

Each chunk is printed as it arrives, with its position in the request's audio.
"""

from __future__ import annotations

import sys

import anyio

from indextts_client import Client, ProgressEvent

TEXT = "Streaming starts with the first sentence. The rest follows while you listen. Then it ends."


def on_progress(event: ProgressEvent) -> None:
    # Runs in the task that iterates the stream; it may also be an ``async def``.
    fraction = "?" if event.fraction is None else f"{event.fraction:.0%}"
    print(f"  progress {event.stage:<10} {fraction:>4} {event.message}".rstrip())


async def main(engine: str) -> None:
    # The fake engine's options make its "synthesis" take visible time: 0.5 s of audio per chunk,
    # 0.05 s of simulated compute before each one.
    options = {"delay": 0.05} if engine == "fake" else {}
    async with Client(engine) as client:
        print(f"engine {client.info.engine}, native rate {client.info.sample_rate} Hz")
        total = 0
        async with client.stream(TEXT, on_progress=on_progress, **options) as chunks:
            async for chunk in chunks:
                total += len(chunk)
                print(
                    f"chunk {chunk.seq}: offset {chunk.offset_samples} samples, "
                    f"length {len(chunk)} samples ({chunk.duration:.2f} s at {chunk.sample_rate} Hz)"
                )
        print(f"done: {total} samples")


if __name__ == "__main__":
    engine = sys.argv[1] if len(sys.argv) > 1 else "fake"
    if engine not in ("fake", "espeak"):
        sys.exit(f"usage: {sys.argv[0]} [fake|espeak]")
    anyio.run(main, engine)

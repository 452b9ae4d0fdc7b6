"""Speak an LLM's answer while it is still being written: ``stream_text``.

    python examples/stream_text.py [ENGINE] [OUT.wav]     (default: fake; needs the [realtime] extra)

A fake "LLM" yields the answer a few characters at a time; each sentence is spoken as soon
as it is complete (and the next one already waits on the sidecar), the audio written to a WAV
file in order.  The second turn is interrupted after its first sentence (barge-in): leaving
the ``async with`` block cancels what was still queued.
"""

from __future__ import annotations

import sys
import wave
from collections.abc import AsyncIterator

import anyio

from indextts_client import Client

ANSWER = "Sure. The museum opens at nine. Tickets are twelve euros, and children go free. Enjoy your visit!"


async def llm(text: str) -> AsyncIterator[str]:
    for start in range(0, len(text), 3):
        await anyio.sleep(0.01)  # tokens arrive over time
        yield text[start : start + 3]


async def main(engine: str, out: str) -> None:
    async with Client(engine) as client:
        with wave.open(out, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(client.info.sample_rate or 24000)
            async with client.stream_text(llm(ANSWER)) as chunks:
                async for chunk in chunks:
                    if chunk.seq == 0:
                        print(f"sentence {chunk.sentence}: {chunk.text!r}")
                    wav.writeframes(chunk.samples.tobytes())
        async with client.stream_text(llm("This one is cut off. The user spoke over it.")) as chunks:
            async for chunk in chunks:
                if chunk.sentence == 1:
                    break  # barge-in: the rest is cancelled on the sidecar
        print(f"interrupted in sentence {chunk.sentence}; wrote {out}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "fake", sys.argv[2] if len(sys.argv) > 2 else "answer.wav")

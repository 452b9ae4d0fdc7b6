"""What the LiveKit service adds to the first audio: its stream against the bare WebSocket route.

    .venv-lk/bin/python bench/bench_agents_livekit.py [--rounds 60] [--engine fake|espeak]

(any Python with the ``livekit`` and ``server`` extras.)  One ``serve`` process; both sides keep
their WebSocket open across rounds, and each round opens a new context with the same sentence:

* **service**: ``TTS.stream()``, the sentence pushed and the input ended, to the first
  ``SynthesizedAudio`` out of the stream: LiveKit's own machinery included (its input channel,
  the ``AudioEmitter`` and its framing, the output channels), as an ``AgentSession`` sees it.
* **bare**: the same events (``context.config``, ``input.text``, ``input.done``) sent with
  aiohttp, the library the service uses, to the first binary frame of the context.

The two take turns each round (the order alternating), each to its context's end; the
figures are medians over rounds with quartiles and min-max, and the per-round difference
(service minus bare, paired), which is the service's overhead.  Goal: under 5 ms, median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # http_support: serve as the tests run it

from http_support import KEY, server

from indextts_client.integrations.livekit import TTS

TEXT = "The museum opens at nine in the morning."


async def bare(ws: aiohttp.ClientWebSocketResponse, context: str) -> float:
    start = time.perf_counter()
    for event in (
        {"type": "context.config", "context_id": context, "voice": "alloy", "response_format": "pcm"},
        {"type": "input.text", "context_id": context, "text": TEXT},
        {"type": "input.done", "context_id": context},
    ):
        await ws.send_str(json.dumps(event))
    first = None
    async for message in ws:
        if message.type is aiohttp.WSMsgType.BINARY and first is None:
            first = time.perf_counter() - start
        elif message.type is aiohttp.WSMsgType.TEXT:
            event = json.loads(message.data)
            if event["type"] in ("context.done", "error"):
                assert event["type"] == "context.done", event
                break
    assert first is not None
    return first


async def service(speaker: TTS) -> float:
    start = time.perf_counter()
    async with speaker.stream() as stream:
        stream.push_text(TEXT)
        stream.end_input()
        first = None
        async for _audio in stream:
            if first is None:
                first = time.perf_counter() - start
    assert first is not None
    return first


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    q1, _, q3 = statistics.quantiles(ms, n=4)
    return f"{statistics.median(ms):7.2f} ms  (quartiles {q1:.2f} .. {q3:.2f}; {min(ms):.2f} .. {max(ms):.2f})"


async def main(base: str, rounds: int) -> None:
    speaker = TTS(url=base, api_key=KEY)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            base.replace("http://", "ws://") + "/v1/audio/speech/stream", headers={"Authorization": f"Bearer {KEY}"}
        ) as ws,
    ):
        assert json.loads((await ws.receive()).data)["type"] == "session.ready"
        try:
            await service(speaker)  # warm-up: both sockets open, the voice loaded
            await bare(ws, "warm")
            served, bared = [], []
            for i in range(rounds):
                if i % 2:
                    bared.append(await bare(ws, f"b{i}"))
                    served.append(await service(speaker))
                else:
                    served.append(await service(speaker))
                    bared.append(await bare(ws, f"b{i}"))
        finally:
            await speaker.aclose()
    print(f"first audio, {rounds} rounds: median (quartiles; min .. max)")
    print(f"  service (LiveKit stream): {summary(served)}")
    print(f"  bare route (aiohttp):     {summary(bared)}")
    print(f"  overhead (paired):        {summary([s - b for s, b in zip(served, bared, strict=True)])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--engine", default="fake")
    args = parser.parse_args()
    with server("--engine", args.engine, "--api-key", KEY) as running:
        asyncio.run(main(running.base, args.rounds))

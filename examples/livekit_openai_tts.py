"""LiveKit Agents' OpenAI TTS pointed at ``indextts-client serve``, with a barge-in.

    pip install "livekit-agents[openai]"          (not one of this project's extras)
    python examples/livekit_openai_tts.py [ENGINE]   (default: fake)

A real agent passes ``tts=openai.TTS(base_url=..., ...)`` to its ``AgentSession``; the session
speaks each sentence of the LLM's answer through it and, when the user talks over the agent,
closes the stream in flight.  Here the same TTS object is driven directly, without a room:
one sentence spoken whole, then one interrupted after its first audio frame, as the session
does on barge-in.  Closing the stream closes its HTTP response, and the server cancels the
request on the sidecar.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

import uvicorn
from livekit.plugins import openai

from indextts_client.http import create_app


async def main(engine: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine, size=1), log_level="warning"))
    serving = asyncio.create_task(server.serve([listener]))
    tts = openai.TTS(
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="not-needed-without---api-key",
        model="tts-1",  # LiveKit asks tts-1 for raw audio bytes, other models for SSE: serve speaks both
        voice="alloy",  # serve's --voice NAME=REF.wav maps names to reference clips
        response_format="pcm",  # 24 kHz 16-bit mono, what LiveKit plays
    )
    try:
        samples = 0
        async with tts.synthesize("Hello from a sidecar, through LiveKit.") as stream:
            async for audio in stream:
                samples += audio.frame.samples_per_channel
                rate = audio.frame.sample_rate
        print(f"spoke {samples} samples at {rate} Hz")

        frames = 0
        stream = tts.synthesize("This long answer is interrupted by the user. " * 4)
        async for _audio in stream:
            frames += 1
            break  # barge-in
        await stream.aclose()
        print(f"interrupted after {frames} frame")
    finally:
        await tts.aclose()
        server.should_exit = True
        await serving


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)  # LiveKit warns that serve sends no x-request-id
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "fake"))

"""LiveKit Agents speaking through this project's own TTS service, with timed words and a barge-in.

    pip install -e ".[livekit,server]"          # from your clone: not on the package index yet
    python examples/livekit_agent.py [ENGINE]   (default: fake)

A real agent passes ``tts=TTS(url="http://127.0.0.1:8000", voice="alice")`` to its
``AgentSession`` (and ``use_tts_aligned_transcript=True``, so that the transcript follows the
words' timings): the session streams each reply's text into one context of the server's
WebSocket route as the LLM writes it and, when the user talks over the agent, closes the
stream, which cancels the context on the sidecar at once.  Here the same TTS object is driven
directly, without a room: one reply streamed in pieces, its words printed with their times,
then one interrupted after its first audio frame, as the session does on barge-in.  The server
runs in this process: the example speaks once the app says it is ready (``on_ready``: its
sidecar loaded the engine), and an engine that cannot load ends it with one line, exit 1.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from indextts_client.http import create_app
from indextts_client.integrations.livekit import TTS


async def main(engine: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    ready = asyncio.Event()  # set once the app's engine loaded, or once it could not (in failed)
    failed: list[BaseException] = []
    app = create_app(engine, size=1, on_ready=ready.set, on_start_failure=lambda exc: [failed.append(exc), ready.set()])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve([listener]))
    tts = TTS(url=f"http://127.0.0.1:{port}", voice="alloy")  # serve --voice NAME=REF.wav names clips
    try:
        await asyncio.wait_for(ready.wait(), 60)  # else the first request is a 503, retried
        if failed:
            raise SystemExit(f"livekit_agent: the engine could not start: {failed[0]}")
        samples, words = 0, []
        async with tts.stream() as stream:
            for piece in ["Hello from a side", "car, through LiveKit. ", "Each word is timed."]:  # as an LLM writes
                stream.push_text(piece)
            stream.end_input()
            async for audio in stream:
                samples += audio.frame.samples_per_channel
                words += audio.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
        print(f"spoke {samples} samples at {tts.sample_rate} Hz")
        for word in words:
            print(f"{word.start_time:5.2f}-{word.end_time:5.2f} s {word.strip()}")

        frames = 0
        stream = tts.stream()
        stream.push_text("This long answer is interrupted by the user. " * 4)
        stream.end_input()
        async for _audio in stream:
            frames += 1
            break  # barge-in
        await stream.aclose()  # sends context.cancel: the sidecar stops this answer now
        print(f"interrupted after {frames} frame")
    finally:
        await tts.aclose()
        server.should_exit = True
        await serving


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "fake"))

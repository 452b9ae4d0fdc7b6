"""Pipecat with IndexTTS's own service: word-timed speech over serve's WebSocket route, with a barge-in.

    pip install -e ".[pipecat,server]"          # from your clone: not on the package index yet
    python examples/pipecat_agent.py [ENGINE]   (default: fake)

An engine that cannot load (espeak without the [espeak] extra) ends it at once with one line
saying why, exit 1.

In a voice agent the service sits between the LLM and the transport, and the assistant's
context aggregator after the transport:
``Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), assistant_aggregator])``.
Here ``serve`` runs in this process (on a loopback port) and the pipeline is just
``[tts, a sink]``.  One turn is spoken whole: its audio, and one ``TTSTextFrame`` per word,
timed to the audio (the route's ``audio.alignment``), which a transport releases as each word
is played, so that an interrupted reply reaches the LLM's context only up to the word heard.
A second turn is interrupted at its first audio, as Pipecat does when the user speaks over
the bot: the service cancels the turn's context on the server (the sidecar stops at once) and
keeps its connection for the next turn.  Written against pipecat-ai 1.14.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from loguru import logger
from pipecat.frames.frames import EndFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame, TTSTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from indextts_client.http import create_app
from indextts_client.integrations.pipecat import IndexTTSService


class Sink(FrameProcessor):
    """Counts each turn's audio and words; interrupts the second turn at its first audio."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = [0, 0]
        self.words: list[tuple[str, float]] = []
        self.turn = 0
        self.spoken = asyncio.Event()
        self.interrupted = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSTextFrame) and self.turn == 0 and frame.pts is not None:
            self.words.append((frame.text, frame.pts / 1e9))
        elif isinstance(frame, TTSAudioRawFrame) and self.turn < 2:
            self.samples[self.turn] += len(frame.audio) // 2
            if self.turn == 1:
                self.turn = 2
                await self.broadcast_interruption()  # the user started to speak
                self.interrupted.set()
        elif isinstance(frame, TTSStoppedFrame) and self.turn == 0:
            self.turn = 1
            self.spoken.set()
        await self.push_frame(frame, direction)


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
    running: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(ready.wait(), 60)
        if failed:
            raise SystemExit(f"pipecat_agent: the engine could not start: {failed[0]}")
        tts = IndexTTSService(url=f"http://127.0.0.1:{port}", sample_rate=24000)
        sink = Sink()
        worker = PipelineWorker(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=24000))
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run())
        await worker.queue_frame(TTSSpeakFrame("Hello from a sidecar, through Pipecat."))
        await asyncio.wait_for(sink.spoken.wait(), 60)
        print(f"spoke {sink.samples[0]} samples at 24000 Hz")
        first = sink.words[0][1]
        print("words: " + " ".join(f"{word}@{at - first:.2f}" for word, at in sink.words))
        await worker.queue_frame(TTSSpeakFrame("This long answer is interrupted by the user. " * 4))
        await asyncio.wait_for(sink.interrupted.wait(), 60)
        print(f"interrupted after {sink.samples[1]} samples")
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 60)
    finally:
        if running is not None and not running.done():  # a failure on the way: stop the pipeline too
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        server.should_exit = True
        await serving


if __name__ == "__main__":
    logger.remove()  # Pipecat logs every frame's journey at DEBUG
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "fake"))

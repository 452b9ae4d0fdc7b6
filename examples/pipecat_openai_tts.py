"""Pipecat's OpenAI TTS service pointed at ``indextts-client serve``, with a barge-in.

    pip install "pipecat-ai[openai]"                 (not one of this project's extras)
    python examples/pipecat_openai_tts.py [ENGINE]   (default: fake)

In a voice agent the service sits between the LLM and the transport:
``Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), ...])``.
Here the pipeline is just ``[tts, a sink that counts the audio]``: one sentence is spoken
whole, then a second is interrupted at its first audio frame, as Pipecat does when the user
speaks over the bot (an ``InterruptionFrame``): the service drops the request in flight, its
HTTP response is closed, and the server cancels it on the sidecar.

Pipecat accepts only OpenAI's voice names: map one to your reference clip on the server,
``serve --voice alloy=/voices/alice.wav``.  Written against pipecat-ai 1.14.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from loguru import logger
from pipecat.frames.frames import EndFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.workers.runner import WorkerRunner

from indextts_client.http import create_app


class Sink(FrameProcessor):
    """Counts the audio of each turn; interrupts the second one at its first frame."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = [0, 0]
        self.turn = 0
        self.spoken = asyncio.Event()
        self.interrupted = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and self.turn < 2:
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
    server = uvicorn.Server(uvicorn.Config(create_app(engine, size=1), log_level="warning"))
    serving = asyncio.create_task(server.serve([listener]))
    tts = OpenAITTSService(
        api_key="not-needed-without---api-key",
        base_url=f"http://127.0.0.1:{port}/v1",
        settings=OpenAITTSService.Settings(voice="alloy", model="tts-1"),
        sample_rate=24000,  # serve's pcm is 24 kHz, as OpenAI's
    )
    sink = Sink()
    worker = PipelineWorker(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=24000))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)  # WorkerRunner.run(worker) is deprecated since 1.3
    running = asyncio.create_task(runner.run())
    try:
        await worker.queue_frame(TTSSpeakFrame("Hello from a sidecar, through Pipecat."))
        await asyncio.wait_for(sink.spoken.wait(), 60)
        print(f"spoke {sink.samples[0]} samples at 24000 Hz")
        await worker.queue_frame(TTSSpeakFrame("This long answer is interrupted by the user. " * 4))
        await asyncio.wait_for(sink.interrupted.wait(), 60)
        print(f"interrupted after {sink.samples[1]} samples")
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 60)
    finally:
        server.should_exit = True
        await serving


if __name__ == "__main__":
    logger.remove()  # Pipecat logs every frame's journey at DEBUG
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "fake"))

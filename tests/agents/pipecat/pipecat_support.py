"""Pipecat's own pipeline around a TTS service, as the tests run it.

``running(processors)`` runs ``Pipeline(processors)`` in a ``PipelineWorker`` under a
``WorkerRunner`` (Pipecat's runner), on this event loop, until the block ends (then an
``EndFrame``, bounded).  ``Collector`` records what passes it; ``Speaker`` is an output
transport whose "device" plays 16-bit audio at real time (each write returns once its
duration has elapsed on the monotonic clock, as a sound card's blocking write does), so that
Pipecat's transport releases the word frames at their presentation times against audio that
is actually being played.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pipecat.frames.frames import EndFrame, Frame, InterruptionFrame, OutputAudioRawFrame, StartFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

#: Seconds any one wait may take (espeak speaks a sentence in milliseconds).
WAIT = 30.0
RATE = 24000


class Collector(FrameProcessor):
    """Records the frames going ``direction`` (and passes every frame on)."""

    def __init__(self, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        super().__init__()
        self.direction = direction
        self.frames: list[Frame] = []
        self._changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.frames.append(frame)
            self._changed.set()
        await self.push_frame(frame, direction)

    def of(self, kind: type[Any]) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)]

    async def wait_for(self, found: Callable[[list[Frame]], bool], what: str) -> None:
        """Until ``found(frames)``; fails after :data:`WAIT` seconds, naming ``what``."""
        try:
            async with asyncio.timeout(WAIT):
                while not found(self.frames):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            names = [type(f).__name__ for f in self.frames]
            raise AssertionError(f"no {what} within {WAIT} s; frames: {names}") from None


class Speaker(BaseOutputTransport):
    """An output transport whose device plays at real time; counts the samples it played
    (a chunk counts from the moment it starts to play), and what it had played when the
    first interruption reached it (``heard``)."""

    def __init__(self, sample_rate: int = RATE) -> None:
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=sample_rate))
        self.rate = sample_rate
        self.played = 0  # samples
        self.heard: int | None = None
        self._busy_until = 0.0
        self._played_changed = asyncio.Event()

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, InterruptionFrame) and self.heard is None:
            self.heard = self.played
        await super().process_frame(frame, direction)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        samples = len(frame.audio) // 2
        now = time.monotonic()
        self.played += samples
        self._played_changed.set()
        self._busy_until = max(self._busy_until, now) + samples / self.rate
        await asyncio.sleep(self._busy_until - now)  # the device's own pace, not a synchronisation
        return True

    async def wait_played(self, samples: int) -> None:
        async with asyncio.timeout(WAIT):
            while self.played < samples:
                self._played_changed.clear()
                await self._played_changed.wait()


@asynccontextmanager
async def running(processors: Sequence[FrameProcessor], sample_rate: int = RATE) -> AsyncIterator[PipelineWorker]:
    """Runs ``Pipeline(processors)`` until the block ends; then ends it with an EndFrame."""
    worker = PipelineWorker(
        Pipeline(list(processors)),
        params=PipelineParams(audio_out_sample_rate=sample_rate),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(_worker: Any, _frame: Frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(WAIT):
            await started.wait()
        yield worker
        await worker.queue_frame(EndFrame())
        async with asyncio.timeout(WAIT):
            await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

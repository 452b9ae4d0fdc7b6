"""What the Pipecat service adds to the first audio of a turn, against the bare WebSocket route.

    python=$(python3 tests/upstream/build_venv.py agents-pipecat)    # the Pipecat venv (.ci/agents)
    PYTHONPATH=. $python bench/bench_agents_pipecat.py [--rounds 7] [--trials 20] [--engine espeak]

One ``indextts-client serve`` (its own process, one sidecar) serves both paths, each over one
connection kept for the whole run:

* bare: the ``websockets`` client sends a new context's ``input.text`` and ``input.flush`` and
  waits for its first binary frame (then for its ``audio.done``, and ends the context);
* service: ``IndexTTSService`` in Pipecat's own pipeline (``PipelineWorker`` under a
  ``WorkerRunner``, ``[service, sink]``), from ``worker.queue_frame(TTSSpeakFrame(text))`` to the
  first ``TTSAudioRawFrame`` at the sink (then to its ``TTSStoppedFrame``).

Each round runs ``--trials`` pairs of turns, one on each path, back to back (which goes first
alternating from pair to pair), so that a change in the machine's load falls on both; it takes
each path's median and the median of the pairs' differences.  It prints each round's figures,
and over the rounds the median extra with its min-max.  The extra is everything between the
pipeline and the socket: Pipecat's frame queues, its sentence and audio context bookkeeping, and
the service's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from loguru import logger
from pipecat.frames.frames import EndFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner
from websockets.asyncio.client import ClientConnection, connect

from indextts_client.integrations.pipecat import IndexTTSService

TEXT = "The museum opens at nine."
RATE = 24000
KEY = "bench-key"
WAIT = 30.0


def start_server(engine: str) -> tuple[subprocess.Popen[bytes], str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    command = [sys.executable, "-m", "indextts_client.http", "--engine", engine, "--api-key", KEY]
    process = subprocess.Popen(
        [*command, "--fd", str(listener.fileno())], pass_fds=[listener.fileno()], stderr=subprocess.PIPE
    )
    listener.close()
    assert process.stderr is not None
    for line in process.stderr:
        if b"serving: engine" in line:
            break
    else:
        raise SystemExit("the server did not start")
    return process, f"http://127.0.0.1:{port}"


class Sink(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.first: float | None = None
        self.first_seen = asyncio.Event()
        self.stopped = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and self.first is None:
            self.first = time.perf_counter()
            self.first_seen.set()
        elif isinstance(frame, TTSStoppedFrame):
            self.stopped.set()
        await self.push_frame(frame, direction)


async def bare_turn(ws: ClientConnection, context_id: str) -> float:
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "input.text", "context_id": context_id, "text": TEXT}))
    await ws.send(json.dumps({"type": "input.flush", "context_id": context_id}))
    first = None
    async with asyncio.timeout(WAIT):
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                if first is None and message[1 : 1 + message[0]].decode() == context_id:
                    first = time.perf_counter()
                continue
            event = json.loads(message)
            if event["type"] == "error":
                raise SystemExit(f"the route refused: {event}")
            if event["type"] == "audio.done" and event["context_id"] == context_id:
                break
        await ws.send(json.dumps({"type": "input.done", "context_id": context_id}))
        while True:
            message = await ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] == "context.done":
                break
    assert first is not None
    return first - start


async def service_turn(worker: PipelineWorker, sink: Sink) -> float:
    sink.first = None
    sink.first_seen.clear()
    sink.stopped.clear()
    start = time.perf_counter()
    await worker.queue_frame(TTSSpeakFrame(TEXT))
    async with asyncio.timeout(WAIT):
        await sink.first_seen.wait()
        await sink.stopped.wait()
    assert sink.first is not None
    return sink.first - start


async def main(args: argparse.Namespace) -> None:
    process, base = start_server(args.engine)
    try:
        tts = IndexTTSService(url=base, api_key=KEY, sample_rate=RATE)
        sink = Sink()
        worker = PipelineWorker(
            Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=RATE), cancel_on_idle_timeout=False
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run())
        url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "session.ready"
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm", "sample_rate": RATE}))
            await bare_turn(ws, "warm")  # the sidecar's first request loads the engine
            await service_turn(worker, sink)
            extras = []
            for r in range(args.rounds):
                bare, served, diffs = [], [], []
                for t in range(args.trials):
                    if t % 2 == 0:
                        b = await bare_turn(ws, f"r{r}-{t}")
                        v = await service_turn(worker, sink)
                    else:
                        v = await service_turn(worker, sink)
                        b = await bare_turn(ws, f"r{r}-{t}")
                    bare.append(b * 1000)
                    served.append(v * 1000)
                    diffs.append((v - b) * 1000)
                extra = statistics.median(diffs)
                extras.append(extra)
                print(
                    f"round {r}: bare {statistics.median(bare):.2f} ms, service {statistics.median(served):.2f} ms, "
                    f"extra (median of pairs) {extra:+.2f} ms"
                )
        print(
            f"service's extra first-audio time over {args.rounds} rounds: median {statistics.median(extras):+.2f} ms "
            f"(min {min(extras):+.2f}, max {max(extras):+.2f})"
        )
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, WAIT)
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--engine", default="espeak")
    logger.remove()  # Pipecat logs every frame at DEBUG
    logger.add(sys.stderr, level="WARNING")
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    asyncio.run(main(parser.parse_args()))

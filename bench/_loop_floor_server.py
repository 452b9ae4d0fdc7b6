"""A lower bound for any event-loop design: the least a sidecar on asyncio can do per request.

The same frames as the sidecar (msgpack, length prefix), an asyncio loop reading the
requests from a readiness callback, an engine thread fed through a ``SimpleQueue`` that
writes its ``progress``, ``audio`` and ``done`` frames straight into the pipe.  Nothing
else: no validation, no cancel, no queue limit, no ordering between the loop's ``pong``
and the engine's frames (the benchmark never has both in flight).  Not a server: a
measure of what the machinery of the real one costs above this.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import queue
import threading
from typing import Any

from indextts_sidecar import protocol

RATE = 24000
# The same pipe size as the sidecar's (_fds.py).
try:
    fcntl.fcntl(1, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1024 * 1024)
except OSError:
    pass
jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
cache: dict[float, Any] = {}


def write(parts: list[Any]) -> None:
    """All of ``parts``, from either thread (fd 1 is blocking)."""
    while parts:
        written = os.writev(1, parts)
        parts = [memoryview(p).cast("B") for p in parts]
        while parts and written >= len(parts[0]):
            written -= len(parts.pop(0))
        if parts and written:
            parts[0] = parts[0][written:]


def engine() -> None:
    from indextts_sidecar.engines.fake import render  # numpy: on the engine thread, as in the sidecar

    while (request := jobs.get()) is not None:
        seconds = float(request.options.get("seconds", 0.06))
        step = round(float(request.options.get("chunk_seconds", 0.5)) * RATE)
        audio = cache.get(seconds)
        if audio is None:
            audio = cache[seconds] = render("floor", RATE, seconds=seconds)
        count = max(1, -(-len(audio) // step))
        for seq in range(count):
            pcm = memoryview(audio[seq * step : (seq + 1) * step]).cast("B")
            progress = protocol.Progress(id=request.id, stage="synthesize", fraction=(seq + 1) / count)
            write([protocol.frame(progress)])
            write(list(protocol.audio_frame_parts(request.id, seq, RATE, pcm)))
        done = protocol.Done(id=request.id, samples=len(audio), chunks=count, sample_rate=RATE)
        write([protocol.frame(done)])


def main() -> None:
    loop = asyncio.new_event_loop()
    os.set_blocking(0, False)
    pending = b""  # requests are small: bytes joined, split by their length prefix

    def readable() -> None:
        nonlocal pending
        data = os.read(0, 65536)
        if not data:
            loop.stop()
            return
        pending += data
        while len(pending) >= 4 and len(pending) >= 4 + (size := int.from_bytes(pending[:4], "big")):
            request = protocol.decode_request(pending[4 : 4 + size])
            pending = pending[4 + size :]
            if isinstance(request, protocol.Ping):
                pong = protocol.Pong(id=request.id, loaded=True, queue_depth=0, active=None, uptime=0.0)
                write([protocol.frame(pong)])
            else:
                jobs.put(request)

    threading.Thread(target=engine, daemon=True).start()
    loop.add_reader(0, readable)
    os.write(1, b"R")
    loop.run_forever()
    jobs.put(None)


if __name__ == "__main__":
    main()

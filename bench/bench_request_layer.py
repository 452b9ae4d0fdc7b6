"""What the client's request layer costs a ``synthesize()``, apart from the connection under it.

    .venv/bin/python bench/bench_request_layer.py [--rounds 5] [--requests 3000]

In one process, on asyncio and on trio, a :class:`~indextts_client.Connection` over two pipes
talks to a stand-in sidecar task of the same event loop that answers each ``synthesize`` with
pre-built frames (one ``audio`` frame with one word, then ``done``, in one write).  Two ways
of asking are timed, each round in a fresh process (the order rotating, all with the round's
``PYTHONHASHSEED``):

- ``synthesize``: ``Connection.synthesize()``, the whole request layer (``_wire/_request.py``
  and ``_wire/_request_run.py``: arguments, deadlines, resends, cancel on abandon);
- ``exchange``: the same request through the connection's seam alone (``open_exchange``,
  ``send``, the exchange's wait, the assembled audio checked and returned as an ``Audio``):
  no deadline, no resend, no cancel, what no caller may use, the least that layer could cost.

Prints the CPU time (``time.process_time``) per request, client and stand-in together, as the
median (min-max) over the rounds of each round's best of five batches, and the per-round
difference: the most a leaner request layer could win in the parent, per request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import anyio

from indextts_client._audio import Audio
from indextts_client._wire._connection import Connection
from indextts_sidecar import protocol
from indextts_sidecar.protocol.framing import FrameReader
from indextts_sidecar.protocol.streams import FdReceiveStream, FdSendStream

MODES = ("synthesize", "exchange")
BACKENDS = ("asyncio", "trio")
PCM = memoryview(b"\x01\x00" * 1440)  # 0.06 s at 24 kHz, as bench_requests.py asks for


async def stand_in(read_fd: int, write_fd: int) -> None:
    """A sidecar's answers without a sidecar: ``ready``, then audio and ``done`` for each request."""
    reader = FrameReader(FdReceiveStream(read_fd), max_frame_size=1 << 20)
    out = FdSendStream(write_fd)
    ready = protocol.Ready(
        protocol=1, version="stand-in", engine="fake", pid=os.getpid(), max_frame_size=16 << 20,
        capabilities=["word_timings"],
    )  # fmt: skip
    await out.send(protocol.frame(ready))
    timings = {"queued": 0.0, "first_audio": 0.0, "synthesis": 0.0, "total": 0.0}
    while (body := await reader.receive()) is not None:
        request = protocol.decode_request(body)
        head, pcm = protocol.audio_frame_parts(request.id, 0, 24000, PCM, [protocol.WordSpan(0, 1, 0, len(PCM) // 2)])
        done = protocol.Done(id=request.id, samples=len(PCM) // 2, chunks=1, sample_rate=24000, timings=timings)
        await out.send_parts([head, pcm, protocol.frame(done)])


async def by_exchange(conn: Connection) -> Audio:
    """The request through the connection's seam alone (see the module doc)."""
    ex = conn.open_exchange(lambda i: protocol.Synthesize(id=i, text="x", options={"seconds": 0.06}, progress=False))
    assembler = ex.assemble_audio("x")
    ex.progress_wanted = False
    await conn.send(ex)
    while (item := ex.next_item()) is None:
        await ex.wait()
    assert isinstance(item, protocol.Done)
    assembler.check_done(item.samples, item.chunks, item.sample_rate)
    words = assembler.all_words(item.sample_rate, item.words)
    return Audio(
        assembler.assemble(), item.sample_rate, dict(item.timings), item.id, facts=dict(item.facts), words=words
    )


async def worker(mode: str, requests: int) -> float:
    """The best CPU microseconds per request over five batches of ``requests``."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    best = float("inf")
    async with anyio.create_task_group() as tg:
        tg.start_soon(stand_in, to_child, from_child)
        async with Connection(FdReceiveStream(to_parent), FdSendStream(from_parent)) as conn:

            async def one() -> Audio:
                if mode == "exchange":
                    return await by_exchange(conn)
                return await conn.synthesize("x", seconds=0.06)

            for _ in range(2000):  # past the first tenths of a second of a new process
                await one()
            for _ in range(5):
                began = time.process_time()
                for _ in range(requests):
                    audio = await one()
                best = min(best, (time.process_time() - began) / requests * 1e6)
                assert len(audio.samples) == len(PCM) // 2 and len(audio.words) == 1
        tg.cancel_scope.cancel()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--hash-seed", type=int, default=1)
    parser.add_argument("--worker", nargs=2, metavar=("BACKEND", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        backend, mode = args.worker
        print(json.dumps(anyio.run(worker, mode, args.requests, backend=backend)))
        return
    cells = [(backend, mode) for backend in BACKENDS for mode in MODES]
    results: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
    for number in range(args.rounds):
        shift = number % len(cells)
        for backend, mode in cells[shift:] + cells[:shift]:
            env = {**os.environ, "PYTHONHASHSEED": str(args.hash_seed + number)}
            command = [sys.executable, __file__, "--requests", str(args.requests), "--worker", backend, mode]
            output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            results[backend, mode].append(json.loads(output))
    print(f"{args.rounds} rounds x 5 batches of {args.requests} requests; CPU us per request, median (min-max):")

    def stat(values: list[Any]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    for backend in BACKENDS:
        full, bare = results[backend, "synthesize"], results[backend, "exchange"]
        layer = [a - b for a, b in zip(full, bare, strict=True)]
        print(f"{backend:8} synthesize {stat(full)}   exchange {stat(bare)}   request layer {stat(layer)}")


if __name__ == "__main__":
    main()

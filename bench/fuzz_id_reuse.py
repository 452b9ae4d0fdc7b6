"""A pipelined fuzz of a piped sidecar that reuses a few ids over and over (docs/reliability.md).

    .venv/bin/python bench/fuzz_id_reuse.py [--bursts 3000] [--seed 1] [--ids 4]

Bursts of 1 to 60 frames (synthesize, ping, cancel, load, unload, an ill-typed request) go out
without waiting for answers, their ids drawn from a handful, so that an id comes back the
moment it ended.  Reading the replies, it checks the order the protocol promises: per id,
audio frames numbered 0, 1, 2... since that id's previous terminal frame, and a ``done``
counting exactly those.  Prints the violations found (0 expected).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys

import anyio
import msgspec

from indextts_sidecar import protocol


def _request(rng: random.Random, ids: int) -> dict[str, object]:
    i = rng.randrange(ids)
    r = rng.random()
    if r < 0.5:
        options: dict[str, object] = {}
        if rng.random() < 0.5:
            options["chunk_seconds"] = rng.choice([0.005, 0.01, 0.02])
        if rng.random() < 0.1:
            options["delay"] = 0.001
        return {"op": "synthesize", "id": i, "text": "ab" * rng.randint(1, 6), "options": options}
    if r < 0.65:
        return {"op": "ping", "id": i}
    if r < 0.85:
        return {"op": "cancel", "id": i, "target": rng.randrange(ids)}
    if r < 0.9:
        return {"op": "load", "id": i}
    if r < 0.92:
        return {"op": "unload", "id": i}
    return {"op": "synthesize", "id": i, "text": 5}  # ill-typed: an error for that id


async def main(bursts: int, seed: int, ids: int) -> int:
    rng = random.Random(seed)
    command = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "ERROR"]
    process = await anyio.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout
    violations: list[tuple[object, ...]] = []
    counted: dict[int, int] = {}
    last_seq: dict[int, int] = {}
    buffer = bytearray()

    async def write() -> None:
        for _ in range(bursts):
            burst = [msgspec.msgpack.encode(_request(rng, ids)) for _ in range(rng.randint(1, 60))]
            await stdin.send(b"".join(len(b).to_bytes(4, "big") + b for b in burst))
            await anyio.sleep(rng.choice([0, 0, 0.001, 0.005]))  # pacing, not synchronisation
        await stdin.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        while True:
            while len(buffer) < 4 or len(buffer) < 4 + int.from_bytes(buffer[:4], "big"):
                try:
                    buffer += await stdout.receive()
                except anyio.EndOfStream:
                    break
            else:
                size = int.from_bytes(buffer[:4], "big")
                reply = protocol.decode_reply(bytes(buffer[4 : 4 + size]))
                del buffer[: 4 + size]
                request_id = getattr(reply, "id", None)
                if request_id is None:
                    continue
                if isinstance(reply, protocol.Audio):
                    if reply.seq != last_seq.get(request_id, -1) + 1:
                        violations.append(("seq", request_id, last_seq.get(request_id), reply.seq))
                    last_seq[request_id] = reply.seq
                    counted[request_id] = counted.get(request_id, 0) + 1
                elif protocol.is_terminal(reply):
                    seen = counted.get(request_id, 0)
                    if isinstance(reply, protocol.Done) and reply.chunks != seen:
                        violations.append(("done.chunks", request_id, reply.chunks, seen))
                    elif isinstance(reply, (protocol.Pong, protocol.Ok)) and seen:
                        violations.append(("terminal amid audio", request_id, type(reply).__name__, seen))
                    counted[request_id], last_seq[request_id] = 0, -1
                continue
            break
    await process.wait()
    print(f"{bursts} bursts, seed {seed}, {ids} ids: {len(violations)} order violations {violations[:5]}")
    return 1 if violations else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ids", type=int, default=4)
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.bursts, args.seed, args.ids))

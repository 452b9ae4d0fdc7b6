"""Per-request cost, side by side: this project on asyncio and on trio, the seed's protocol, a raw pipe.

    .venv/bin/python bench/bench_requests.py [--rounds 5] [--requests 300] [--in-flight 1]
        [--op synthesize|ping] [--seconds 0.06] [--chunk-seconds 0.5] [--cpus 0] [--hash-seed 1]

Each round starts every contender afresh, in the rotating order: a parent process of its
own and its sidecar (or server), all with the round's ``PYTHONHASHSEED`` (``--hash-seed``
plus the round's number), kept busy for ``--warmup`` seconds (a new pair of processes runs
differently for its first few tenths of a second); then ``--requests`` requests, one after
another (or ``--in-flight`` at a time for ours), and it is closed.  A process keeps its hash
seed and memory layout for life, and on this machine they alone move its per-request cost
by up to a fifth: fresh processes each round put that draw into the spread, where one
process per run would carry a single draw into every round.

A request is a ``synthesize`` of ``--seconds`` of audio with zero model time (the fake
engine yields it in chunks of ``--chunk-seconds``; the seed's protocol returns it whole,
the raw pipe in one block), or with ``--op ping`` a health check (the raw pipe answers an
empty block).  With one request in flight the
asyncio floor runs too: the same frames between an asyncio parent and an asyncio child with
an engine thread, and nothing else (``_loop_floor_server.py``), the least an event-loop
design pays.

Besides wall time, it reads the CPU time both processes spent (the parent's
``process_time``, the child's ``utime + stime`` from ``/proc/PID/stat``), so what each
request costs shows apart from how busy the machine was.  Prints medians with min-max
over the rounds, and per-round ratios to the seed and to the raw pipe (its time, and its
parent's CPU).  ``--cpus`` pins this script, and so every child, to the CPUs given: with
one CPU no wake-up has to reach another CPU.  Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Union

from _checkouts import REPO, checkout_env

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = checkout_env(REPO)
TICK = os.sysconf("SC_CLK_TCK")


def child_cpu(pids: list[int]) -> float:
    """Seconds of CPU (user + system) the processes ``pids`` have used, together."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


# ------------------------------------------------------------------ worker (ours, one backend)

WORKER = r"""
import json, resource, sys, time
import anyio
from indextts_client import Client

async def main():
    settings = json.loads(sys.argv[2])
    options = {"seconds_per_char": 0.06}
    if settings["chunk_seconds"] is not None:
        options["chunk_seconds"] = settings["chunk_seconds"]
    # pool_timeout: past the sidecar's queue of 64, a request refused busy waits for room.
    async with Client("fake", engine_options=options, pool_timeout=60) as client:
        seconds = settings["seconds"]
        held = []

        async def request():
            if settings["op"] == "ping":
                await client.ping()
            else:
                audio = await client.synthesize("x", seconds=seconds)
                assert len(audio.samples) == round(seconds * 24000), len(audio.samples)
                if settings["hold"]:  # the last result stays alive while the next is made
                    held[:] = [audio]

        for _ in range(20):
            await request()
        print(json.dumps({"ready": client.pid}), flush=True)
        for line in sys.stdin:
            count, in_flight = map(int, line.split())
            cpu0 = time.process_time()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            wall0 = time.perf_counter()
            if in_flight == 1:  # one after another, in this task, as the seed's parent does
                for _ in range(count):
                    await request()
            else:
                limit = anyio.Semaphore(in_flight)

                async def one():
                    async with limit:
                        await request()

                async with anyio.create_task_group() as tg:
                    for _ in range(count):
                        tg.start_soon(one)
            print(json.dumps({"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0,
                              "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0}), flush=True)

anyio.run(main, backend=sys.argv[1])
"""


class Worker:
    """One contender in a process of its own, spawned for one round and closed after it.

    A fresh process each round draws its own hash seed (``PYTHONHASHSEED``, which the
    round sets for every contender alike) and memory layout: on this machine those move
    one process's per-request cost by up to a fifth for its whole life, so a process
    kept for a whole run would carry one draw into every round.
    """

    def __init__(self, name: str, command: list[str], repo: str, hash_seed: int, args: argparse.Namespace) -> None:
        self.name = name
        env = {
            **os.environ,
            "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONHASHSEED": str(hash_seed),
        }
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=repo, text=True
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        #: The pids of the processes that answer the requests (the sidecar, the server; a
        #: pool's sidecars): the worker's first line, ``{"ready": PID}`` or a list of them.
        ready = json.loads(self.process.stdout.readline())["ready"]
        self.children: list[int] = ready if isinstance(ready, list) else [ready]
        #: The parent's minor page faults per request, in the last run (0 where its worker does not count them).
        self.faults = 0.0
        # Past start-up: for its first few tenths of a second a new process pair here runs
        # in a regime of its own (more CPU per request, and often faster wake-ups), and a
        # sidecar that serves an application is long past it.
        began = time.perf_counter()
        while time.perf_counter() - began < args.warmup:
            self.run(max(1, args.requests // 10), args.in_flight)

    def run(self, count: int, in_flight: int) -> tuple[float, float, float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        before = child_cpu(self.children)
        self.process.stdin.write(f"{count} {in_flight}\n")
        self.process.stdin.flush()
        report = json.loads(self.process.stdout.readline())
        self.faults = report.get("faults", 0) / count
        return report["wall"], report["cpu"], child_cpu(self.children) - before

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


#: (name, a function of the round's hash seed that starts the contender's worker)
Contender = tuple[str, Callable[[int], Worker]]


def _settings(args: argparse.Namespace) -> str:
    return json.dumps({"op": args.op, "seconds": args.seconds, "chunk_seconds": args.chunk_seconds, "hold": args.hold})


def ours(backend: str, args: argparse.Namespace, repo: str = REPO, name: str = "ours") -> Contender:
    """The client and sidecar of the checkout at ``repo``, on ``backend``."""
    command = [sys.executable, "-c", WORKER, backend, _settings(args)]
    return f"{name} ({backend})", lambda seed: Worker(f"{name} ({backend})", command, repo, seed, args)


def yardstick(kind: str, args: argparse.Namespace) -> Contender:
    """One of the yardsticks (``seed``, ``raw pipe``, ``asyncio floor``), its parent in a worker."""
    command = [sys.executable, os.path.abspath(__file__), "--serve", kind, _settings(args)]
    return kind, lambda seed: Worker(kind, command, REPO, seed, args)


class Seed:
    """The seed's protocol (JSON + base64, blocking), driven from this process."""

    def __init__(self, args: argparse.Namespace) -> None:
        sys.path.insert(0, HERE)
        from _yardsticks import SeedParent

        self.parent = SeedParent()
        self.pid = self.parent.process.pid
        self.op, self.seconds = args.op, args.seconds
        for _ in range(20):
            self.request()

    def request(self) -> None:
        if self.op == "ping":
            self.parent.send({"op": "ping"})
            assert self.parent.receive()["op"] == "pong"
        else:
            assert len(self.parent.synthesize(self.seconds)) == round(self.seconds * 24000)

    def run(self, count: int) -> tuple[float, float]:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(count):  # the seed answers one request at a time, whatever is asked in flight
            self.request()
        return time.perf_counter() - wall0, time.process_time() - cpu0

    def close(self) -> None:
        self.parent.close()


class Floor:
    """A raw pipe: a length prefix each way, the same bytes of audio, no protocol at all."""

    def __init__(self, args: argparse.Namespace) -> None:
        sys.path.insert(0, HERE)
        from _yardsticks import FloorParent

        self.parent = FloorParent()
        self.pid = self.parent.process.pid
        self.seconds = 0.0 if args.op == "ping" else args.seconds
        self.run(20)

    def run(self, count: int) -> tuple[float, float]:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            self.parent.request(self.seconds)
        return time.perf_counter() - wall0, time.process_time() - cpu0

    def close(self) -> None:
        self.parent.close()


async def floor_requests(
    read_fd: int,
    write_fd: int,
    ids: Iterator[int],
    count: int,
    options: Union[dict[str, Any], None],
    samples: int,
    marks: Union[list[tuple[float, float]], None] = None,
) -> None:
    """The asyncio floor's parent: ``count`` requests one at a time, to ``_loop_floor_server.py``.

    A readiness callback splits and decodes the frames and completes a future per request;
    a ``synthesize`` (with ``options``; None: a ping) joins its audio into one array and
    checks it holds ``samples``.  ``marks`` gets each request's (began, ended).
    """
    import numpy as np

    from indextts_sidecar import protocol
    from indextts_sidecar.protocol.framing import FrameSplitter

    loop = asyncio.get_running_loop()
    os.set_blocking(read_fd, False)
    splitter = FrameSplitter(protocol.DEFAULT_MAX_FRAME_SIZE)
    waiting: dict[int, tuple[asyncio.Future[None], list[memoryview]]] = {}

    def readable() -> None:
        frames: list[memoryview] = []
        splitter.feed(os.read(read_fd, 256 * 1024), frames)
        for body in frames:
            reply = protocol.decode_reply(body)
            if isinstance(reply, protocol.Audio):
                waiting[reply.id][1].append(reply.pcm)
            elif isinstance(reply, (protocol.Done, protocol.Pong)):
                waiting.pop(reply.id)[0].set_result(None)

    loop.add_reader(read_fd, readable)
    clock = time.perf_counter
    try:
        for _ in range(count):
            request_id = next(ids)
            done: asyncio.Future[None] = loop.create_future()
            parts: list[memoryview] = []
            waiting[request_id] = (done, parts)
            began = clock()
            if options is None:
                os.write(write_fd, protocol.frame(protocol.Ping(id=request_id)))
                await done
            else:
                os.write(write_fd, protocol.frame(protocol.Synthesize(id=request_id, text="x", options=options)))
                await done
                audio = np.concatenate([np.frombuffer(part, dtype="<i2") for part in parts])
                assert len(audio) == samples
            if marks is not None:
                marks.append((began, clock()))
    finally:
        loop.remove_reader(read_fd)


class LoopFloor:
    """The least an asyncio parent does per request, against ``_loop_floor_server.py``.

    A readiness callback splits and decodes the frames and completes a future per
    request; audio is joined into one array at the end.  No deadlines, no cancels, no
    supervision: what an event-loop design costs before any of its features.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        sys.path.insert(0, HERE)
        from _yardsticks import spawn_server

        self.process = spawn_server("_loop_floor_server.py")
        self.pid = self.process.pid
        options = {"seconds": args.seconds}
        if args.chunk_seconds is not None:
            options["chunk_seconds"] = args.chunk_seconds
        self.ping = args.op == "ping"
        self.options, self.samples = options, round(args.seconds * 24000)
        self.ids = itertools.count(1)
        asyncio.run(self._requests(20))

    async def _requests(self, count: int) -> tuple[float, float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await floor_requests(
            self.process.stdout.fileno(),
            self.process.stdin.fileno(),
            self.ids,
            count,
            None if self.ping else self.options,
            self.samples,
        )
        return time.perf_counter() - wall0, time.process_time() - cpu0

    def run(self, count: int) -> tuple[float, float]:
        return asyncio.run(self._requests(count))

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(10)
        self.process.stdout.close()


def serve(kind: str, settings: str) -> None:
    """A yardstick's worker (``--serve``): its parent runs here, its server is a child; see :class:`Worker`."""
    import resource

    args = argparse.Namespace(**json.loads(settings))
    kinds: dict[str, Callable[[argparse.Namespace], Union[Seed, Floor, LoopFloor]]] = {
        "seed": Seed,
        "raw pipe": Floor,
        "asyncio floor": LoopFloor,
    }
    contender = kinds[kind](args)
    print(json.dumps({"ready": contender.pid}), flush=True)
    try:
        for line in sys.stdin:
            count, _ = map(int, line.split())  # one at a time, whatever is asked in flight
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            wall, cpu = contender.run(count)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
            print(json.dumps({"wall": wall, "cpu": cpu, "faults": faults}), flush=True)
    finally:
        contender.close()


def stat(values: list[float], scale: float, digits: int = 0) -> str:
    """Median (min-max) of ``values`` times ``scale``."""
    return (
        f"{statistics.median(values) * scale:.{digits}f} "
        f"({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
    )


def ratios(values: list[float], reference: list[float]) -> str:
    """Median (min-max) of the per-round ratios: the rounds pair up, so drifts cancel."""
    return stat([a / b for a, b in zip(values, reference, strict=True)], 1, 2)


Rows = dict[str, list[tuple[float, float, float]]]


def interleave(contenders: list[Contender], args: argparse.Namespace) -> tuple[Rows, dict[str, list[float]]]:
    """Each contender's (wall, parent CPU, child CPU) per round, the order rotating; and the
    parent's minor page faults per request, per round.

    Every round starts each contender afresh, all with that round's hash seed (``--hash-seed``
    plus the round's number), runs it, and closes it.
    """
    rows: Rows = {name: [] for name, _ in contenders}
    faults: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for number in range(args.rounds):
        shift = number % len(contenders)
        for name, start in contenders[shift:] + contenders[:shift]:
            worker = start(args.hash_seed + number)
            try:
                rows[name].append(worker.run(args.requests, args.in_flight))
                faults[name].append(worker.faults)
            finally:
                worker.close()
    return rows, faults


def worker_options(parser: argparse.ArgumentParser) -> None:
    """``--hash-seed`` and ``--warmup``, which :class:`Worker` and :func:`interleave` read."""
    parser.add_argument(
        "--hash-seed", type=int, default=1, help="PYTHONHASHSEED of every process in the first round (+1 each round)"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of requests each new contender runs before it is measured"
    )


def parse_args(
    description: str, extra: Callable[[argparse.ArgumentParser], object] = lambda _: None
) -> argparse.Namespace:
    """The options shared with bench_ab.py; ``extra`` adds more to the parser."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--op", choices=("synthesize", "ping"), default="synthesize")
    parser.add_argument("--seconds", type=float, default=0.06, help="audio per request")
    parser.add_argument("--chunk-seconds", type=float, default=None, help="the fake engine's chunks (ours)")
    parser.add_argument(
        "--hold", action="store_true", help="ours keeps each result until the next arrives, as most applications do"
    )
    parser.add_argument(
        "--cpus",
        type=lambda text: {int(cpu) for cpu in text.split(",")},
        help="run this script and every child on these CPUs only (e.g. 0): no wake-up crosses CPUs",
    )
    worker_options(parser)
    extra(parser)
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)  # before any child is spawned: they inherit it
    return args


def main() -> None:
    args = parse_args(
        __doc__.split("\n\n")[0], lambda parser: parser.add_argument("--json", help="also write the raw rounds here")
    )
    contenders = [yardstick("seed", args), ours("asyncio", args), ours("trio", args), yardstick("raw pipe", args)]
    if args.in_flight == 1:  # the asyncio floor sends one request at a time
        contenders.append(yardstick("asyncio floor", args))
    rows, _ = interleave(contenders, args)
    n = args.requests
    what = "pings" if args.op == "ping" else f"requests of {args.seconds:g} s of audio"
    chunks = "" if args.chunk_seconds is None else f" in {args.chunk_seconds:g} s chunks"
    print(f"{args.rounds} rounds x {n} {what}{chunks}, {args.in_flight} in flight (ours); median (min-max):")
    print(
        f"{'':24} {'requests/s':>20} {'parent CPU/req (us)':>22} {'child CPU/req (us)':>21}"
        f" {'speed vs seed':>16} {'time vs raw pipe':>18} {'parent CPU vs raw pipe':>23}"
    )
    seed_rates = [n / wall for wall, _, _ in rows["seed"]]
    floor_walls = [wall for wall, _, _ in rows["raw pipe"]]
    floor_cpus = [cpu for _, cpu, _ in rows["raw pipe"]]
    for name, values in rows.items():
        rates = [n / wall for wall, _, _ in values]
        parent = [cpu / n for _, cpu, _ in values]
        child = [cpu / n for _, _, cpu in values]
        walls = [wall for wall, _, _ in values]
        print(
            f"{name:24} {stat(rates, 1):>20} {stat(parent, 1e6):>22} {stat(child, 1e6):>21}"
            f" {ratios(rates, seed_rates):>16} {ratios(walls, floor_walls):>18}"
            f" {ratios([cpu for _, cpu, _ in values], floor_cpus):>23}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rows}, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(*sys.argv[2:4])
    else:
        main()

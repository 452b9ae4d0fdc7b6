"""Where one request's time goes: its critical path, from the pipe syscalls of both processes.

    .venv/bin/python bench/bench_trace.py [--rounds 5] [--requests 2000] [--op synthesize|ping]
        [--backend asyncio|trio] [--before CHECKOUT]

Ours (``Client`` and ``python -m indextts_sidecar --engine fake``) and the asyncio floor
(``_loop_floor_server.py`` and the minimal parent of bench_requests.py) take turns, each
round in fresh processes (a parent of its own and its child), all with the round's
``PYTHONHASHSEED``, busy for ``--warmup`` seconds before the records start (as
bench_requests.py does, and for the same reasons).  Both processes record when each read and write of their frame pipes
begins and ends (``os.read``/``readv``/``write``/``writev`` wrapped; ``time.perf_counter``
is ``CLOCK_MONOTONIC`` on Linux, one clock for both), the parent also when each request
begins and returns.  Requests go one at a time; each round trip splits into:

- parent, to its write: the request's Python work before the request frame is written;
- parent write: the ``write`` syscall, which wakes the child when it sleeps;
- child wakes: from the end of that write to the end of the child's read of it;
- child, to its write: the child's work up to its first reply frame (for ``synthesize``
  this includes the hand-off to the engine thread);
- child write: that ``write`` syscall, which wakes the parent;
- parent wakes: from its end to the end of the parent's last read for the request;
- parent, to the result: the Python work from that read until the request returns.

Prints, per contender, the median (min-max) over the rounds of each part's median.  The
syscall and wake-up parts are what any two processes pay on this machine; the Python parts
are each design's own.  The hooks cost each side well under a microsecond per call.
``--before`` (another checkout, e.g. a git worktree) adds ours from that checkout, client and
sidecar, taking turns with the others: a change's effect on each part, free of the drift
between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _checkouts import REPO, add_before, checkout_env, compile_checkouts  # noqa: E402

#: One record per pipe syscall: (call, fd, began, ended, bytes).
Record = tuple[str, int, float, float, int]
#: Runs one round of a contender, its parent in a process of its own: (each request's begin
#: and end, the parent's records).
Contender = Callable[[argparse.Namespace, str], tuple[list[tuple[float, float]], list[Record]]]
PARTS = (
    "parent, to its write",
    "parent write",
    "child wakes",
    "child, to its write",
    "child write",
    "parent wakes",
    "parent, to the result",
)


def record_pipe_calls() -> list[Record]:
    """Wrap this process's ``os`` read and write calls; returns the list they append to."""
    log: list[Record] = []
    clock = time.perf_counter

    def wrap(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def traced(fd: int, arg: Any) -> Any:
            began = clock()
            result = call(fd, arg)
            size = len(result) if isinstance(result, bytes) else result
            log.append((name, fd, began, clock(), size))
            return result

        return traced

    for name in ("read", "readv", "write", "writev"):
        setattr(os, name, wrap(name, getattr(os, name)))
    return log


def child_main(out: str, argv: list[str]) -> None:
    """The child side: record the pipe calls, run the sidecar (or the floor), write the records at exit."""
    log = record_pipe_calls()
    lock = threading.Lock()

    def dump() -> None:
        with lock, open(out, "w") as f:
            json.dump(log, f)

    exit_now = os._exit

    def _exit(code: int) -> None:  # the sidecar leaves with os._exit when its engine thread is busy
        dump()
        exit_now(code)

    os._exit = _exit  # type: ignore[assignment]
    if argv[0] == "floor":
        sys.argv = [os.path.join(HERE, "_loop_floor_server.py")]
        runpy.run_path(sys.argv[0], run_name="__main__")
        dump()
        return
    from indextts_sidecar._main import main

    code = main(argv)
    dump()
    sys.exit(code)


def _after(records: list[Record], when: float, field: int = 2) -> Record:
    """The first record whose ``field`` (2: began, 3: ended) is at or after ``when``."""
    return next(r for r in records if (r[2] if field == 2 else r[3]) >= when)


def split(marks: list[tuple[float, float]], parent: list[Record], child: list[Record]) -> dict[str, list[float]]:
    """Each request's round trip cut into PARTS (seconds), from both sides' records."""
    writes = [r for r in parent if r[0].startswith("write")]
    reads = [r for r in parent if r[0].startswith("read") and r[4] > 0]
    child_reads = [r for r in child if r[0].startswith("read") and r[4] > 0]
    child_writes = [r for r in child if r[0].startswith("write")]
    parts: dict[str, list[float]] = {name: [] for name in PARTS}
    for began, ended in marks:
        write = _after(writes, began)
        received = _after(child_reads, write[2], 3)  # its read may end before the parent's write returns
        answer = _after(child_writes, received[3])
        # The parent's read may end before the child's write returns (on another core).
        last = [r for r in reads if answer[2] <= r[3] <= ended][-1]
        values = (
            write[2] - began,
            write[3] - write[2],
            received[3] - write[3],
            answer[2] - received[3],
            answer[3] - answer[2],
            last[3] - answer[3],
            ended - last[3],
        )
        for name, value in zip(PARTS, values, strict=True):
            parts[name].append(value)
    return parts


def _child_command(out: str, *argv: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--child", out, "--", *argv]


def parent_main(args: argparse.Namespace) -> None:
    """A contender's parent, in a process of its own (``--parent``): run the requests, write the records."""
    log = record_pipe_calls()
    marks, recorded = (run_floor if args.kind == "floor" else run_ours)(args, args.child_out, log)
    with open(args.parent, "w") as f:
        json.dump({"marks": marks, "parent": recorded}, f)


def in_own_process(kind: str, repo: str = REPO) -> Contender:
    """A contender (``ours`` from the checkout ``repo``, or the ``floor``): its parent in a process of its own."""

    def run(args: argparse.Namespace, out: str) -> tuple[list[tuple[float, float]], list[Record]]:
        report = out + ".parent"
        argv = ["--op", args.op, "--backend", args.backend, "--requests", str(args.requests), "--kind", kind]
        argv += ["--warmup", str(args.warmup)]
        command = [sys.executable, os.path.abspath(__file__), "--parent", report, "--child-out", out, *argv]
        subprocess.run(command, env=checkout_env(repo), cwd=repo, check=True)
        with open(report) as f:
            result = json.load(f)
        return [tuple(m) for m in result["marks"]], [tuple(r) for r in result["parent"]]

    return run


def run_ours(args: argparse.Namespace, out: str, log: list[Record]) -> tuple[list[tuple[float, float]], list[Record]]:
    import anyio

    from indextts_client import Client

    marks: list[tuple[float, float]] = []
    recorded: list[Record] = []
    repo = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["indextts_client"].__file__ or "")))

    async def main() -> None:
        command = _child_command(out, "--engine", "fake", "--log-level", "warning")
        async with Client(command=command, env={"PYTHONPATH": repo}) as client:

            async def request() -> None:
                if args.op == "ping":
                    await client.ping()
                else:
                    assert len((await client.synthesize("x", seconds=0.06)).samples) == 1440

            clock = time.perf_counter
            began = clock()
            while clock() - began < args.warmup:  # past a new pair's first regime (bench_requests.py)
                await request()
            del log[:]
            clock = time.perf_counter
            for _ in range(args.requests):
                began = clock()
                await request()
                marks.append((began, clock()))
            recorded.extend(r for r in log if r[0] in ("readv", "writev"))  # the frame pipes' calls

    anyio.run(main, backend=args.backend)
    return marks, recorded


def run_floor(args: argparse.Namespace, out: str, log: list[Record]) -> tuple[list[tuple[float, float]], list[Record]]:
    import asyncio
    import itertools

    from bench_requests import ENV, floor_requests

    process = subprocess.Popen(
        _child_command(out, "floor"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=ENV
    )
    assert process.stdin is not None and process.stdout is not None
    assert process.stdout.read(1) == b"R"
    read_fd, write_fd = process.stdout.fileno(), process.stdin.fileno()
    options = None if args.op == "ping" else {"seconds": 0.06}
    marks: list[tuple[float, float]] = []
    ids = itertools.count(1)

    async def main() -> None:
        # bench_requests.py's asyncio floor parent: a readiness callback completes a future per request.
        began = time.perf_counter()
        while time.perf_counter() - began < args.warmup:
            await floor_requests(read_fd, write_fd, ids, 100, options, 1440)
        del log[:]
        await floor_requests(read_fd, write_fd, ids, args.requests, options, 1440, marks)

    asyncio.run(main())
    recorded = [r for r in log if r[1] in (read_fd, write_fd)]
    process.stdin.close()
    process.wait(10)
    process.stdout.close()
    return marks, recorded


def main() -> None:
    from bench_requests import worker_options

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--op", choices=("synthesize", "ping"), default="synthesize")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio", help="ours")
    add_before(parser)
    worker_options(parser)
    parser.add_argument("--kind", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--parent", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("argv", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.argv)
        return
    if args.parent:
        parent_main(args)
        return
    contenders = {f"ours ({args.backend})": in_own_process("ours"), "asyncio floor": in_own_process("floor")}
    if args.before:
        compile_checkouts(REPO, args.before)
        contenders[f"before ({args.backend})"] = in_own_process("ours", args.before)
    rounds: dict[str, dict[str, list[float]]] = {name: {part: [] for part in (*PARTS, "total")} for name in contenders}
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "child.json")
        for number in range(args.rounds):
            # Every process of the round (the parents, the children) with the round's hash seed.
            os.environ["PYTHONHASHSEED"] = str(args.hash_seed + number)
            names = list(contenders) if number % 2 == 0 else list(reversed(contenders))
            for name in names:
                marks, parent = contenders[name](args, out)
                with open(out) as f:
                    child = [tuple(r) for r in json.load(f)]
                parts = split(marks, parent, child)
                for part, values in parts.items():
                    rounds[name][part].append(statistics.median(values))
                rounds[name]["total"].append(statistics.median(e - b for b, e in marks))

    what = "pings" if args.op == "ping" else "requests of 0.06 s of audio"
    print(f"{args.rounds} rounds x {args.requests} {what}, one at a time; per request, us: median (min-max) over the")
    print("rounds of each round's median")
    print(f"{'':24}" + "".join(f"{name:>24}" for name in contenders))
    for part in (*PARTS, "total"):
        cells = []
        for name in contenders:
            values = [v * 1e6 for v in rounds[name][part]]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{part:24}" + "".join(f"{cell:>24}" for cell in cells))


if __name__ == "__main__":
    main()

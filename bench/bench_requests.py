"""Per-request cost, side by side: this project on asyncio and on trio, the seed's protocol, a raw pipe.

    .venv/bin/python bench/bench_requests.py [--rounds 5] [--requests 300] [--in-flight 1]

Each contender keeps one sidecar (or server) alive for the whole run; the rounds rotate
the order, and each round runs ``--requests`` tiny requests (zero model time, 0.06 s of
audio) per contender, one after another (or ``--in-flight`` at a time for ours).  Besides
wall time, it reads the CPU time both processes spent (the parent's ``process_time``, the
child's ``utime + stime`` from ``/proc/PID/stat``), so what each request costs shows apart
from how busy the machine was.  Prints medians with min-max over the rounds, and ratios
to the seed.  Linux only (``/proc``).
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
TICK = os.sysconf("SC_CLK_TCK")


def child_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# ------------------------------------------------------------------ worker (ours, one backend)

WORKER = r"""
import json, sys, time
import anyio
from indextts_client import Client

async def main():
    async with Client("fake", engine_options={"seconds_per_char": 0.06}) as client:
        for _ in range(50):
            await client.synthesize("x")
        print(json.dumps({"ready": client.pid}), flush=True)
        for line in sys.stdin:
            count, in_flight = map(int, line.split())
            child = client.pid
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            if in_flight == 1:  # one after another, in this task, as the seed's parent does
                for _ in range(count):
                    await client.synthesize("x")
            else:
                limit = anyio.Semaphore(in_flight)

                async def one():
                    async with limit:
                        await client.synthesize("x")

                async with anyio.create_task_group() as tg:
                    for _ in range(count):
                        tg.start_soon(one)
            print(json.dumps({"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0,
                              "pid": child}), flush=True)

anyio.run(main, backend=sys.argv[1])
"""


class Ours:
    def __init__(self, backend: str) -> None:
        self.name = f"ours ({backend})"
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=ENV,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.child = json.loads(self.process.stdout.readline())["ready"]

    def run(self, count: int, in_flight: int) -> tuple[float, float, float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        before = child_cpu(self.child)
        self.process.stdin.write(f"{count} {in_flight}\n")
        self.process.stdin.flush()
        report = json.loads(self.process.stdout.readline())
        return report["wall"], report["cpu"], child_cpu(self.child) - before

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


class Seed:
    """The seed's protocol (JSON + base64, blocking), driven from this process."""

    def __init__(self) -> None:
        sys.path.insert(0, HERE)
        from bench_protocol import SeedParent

        self.name = "seed"
        self.parent = SeedParent()

    def run(self, count: int, in_flight: int) -> tuple[float, float, float]:
        pid = self.parent.process.pid
        before = child_cpu(pid)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(count):  # the seed answers one request at a time, whatever in_flight says
            self.parent.synthesize(0.06)
        return time.perf_counter() - wall0, time.process_time() - cpu0, child_cpu(pid) - before

    def close(self) -> None:
        self.parent.close()


class Floor:
    """A raw pipe: a length prefix each way, the same bytes of audio, no protocol at all."""

    def __init__(self) -> None:
        sys.path.insert(0, HERE)
        from bench_protocol import FloorParent

        self.name = "raw pipe"
        self.parent = FloorParent()

    def run(self, count: int, in_flight: int) -> tuple[float, float, float]:
        pid = self.parent.process.pid
        before = child_cpu(pid)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            self.parent.request(0.06)
        return time.perf_counter() - wall0, time.process_time() - cpu0, child_cpu(pid) - before

    def close(self) -> None:
        self.parent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=1)
    parser.add_argument("--json", help="also write the raw rounds here")
    args = parser.parse_args()
    contenders: list[Any] = [Seed(), Ours("asyncio"), Ours("trio"), Floor()]
    rows: dict[str, list[tuple[float, float, float]]] = {c.name: [] for c in contenders}
    try:
        for number in range(args.rounds):
            shift = number % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                rows[contender.name].append(contender.run(args.requests, args.in_flight))
    finally:
        for contender in contenders:
            contender.close()
    n = args.requests

    def stat(values: list[float], scale: float, digits: int = 0) -> str:
        return (
            f"{statistics.median(values) * scale:.{digits}f} "
            f"({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})"
        )

    seed_rate = statistics.median(n / wall for wall, _, _ in rows["seed"])
    print(f"{args.rounds} rounds x {n} requests, {args.in_flight} in flight (ours); median (min-max):")
    print(f"{'':14} {'requests/s':>20} {'parent CPU/req (us)':>22} {'child CPU/req (us)':>21} {'vs seed':>8}")
    for name, values in rows.items():
        rates = [n / wall for wall, _, _ in values]
        parent = [cpu / n for _, cpu, _ in values]
        child = [cpu / n for _, _, cpu in values]
        print(
            f"{name:14} {stat(rates, 1):>20} {stat(parent, 1e6):>22} {stat(child, 1e6):>21} "
            f"{statistics.median(rates) / seed_rate:>7.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rows}, f, indent=1)


if __name__ == "__main__":
    main()

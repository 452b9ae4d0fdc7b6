"""Side-by-side benchmark: this project's client and sidecar, the seed's protocol, a raw pipe.

    .venv/bin/python bench/bench_protocol.py [--repeat 15] [--json results.json]

Everything runs in one process run on one machine, so the three columns are comparable.
Medians (min-max) over ``--repeat`` runs after warm-up.  See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

import anyio
import numpy as np

from indextts_client import Client

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
RATE = 24000
DURATIONS = (1, 10, 60)


def summary(samples: list[float], unit: float = 1e3) -> dict[str, float]:
    values = sorted(s * unit for s in samples)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


def fmt(stats: dict[str, float], digits: int = 2) -> str:
    return f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"


# ----------------------------------------------------------------- the seed's protocol


class SeedParent:
    """A parent speaking the seed's protocol: JSON + base64 over blocking pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_seed_protocol_server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=ENV,
        )
        assert self.receive()["op"] == "ready"

    def send(self, obj: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        body = json.dumps(obj).encode()
        self.process.stdin.write(struct.pack("!I", len(body)) + body)
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        (size,) = struct.unpack("!I", self.process.stdout.read(4))
        return json.loads(self.process.stdout.read(size))  # type: ignore[no-any-return]

    def synthesize(self, seconds: float, model_seconds: float = 0.0) -> np.ndarray:
        self.send({"op": "synthesize", "text": "benchmark", "seconds": seconds, "model_seconds": model_seconds})
        reply = self.receive()
        return np.frombuffer(base64.b64decode(reply["audio_pcm_b64"]), dtype="<i2")

    def close(self) -> None:
        self.send({"op": "shutdown"})
        self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


def seed_suite(repeat: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    starts = []
    for _ in range(max(3, repeat // 3)):
        began = time.perf_counter()
        parent = SeedParent()
        starts.append(time.perf_counter() - began)
        parent.close()
    results["spawn_to_ready_ms"] = summary(starts)
    parent = SeedParent()
    try:
        pings = []
        for _ in range(repeat * 10):
            began = time.perf_counter()
            parent.send({"op": "ping"})
            parent.receive()
            pings.append(time.perf_counter() - began)
        results["ping_idle_us"] = summary(pings, 1e6)
        # The seed reads nothing while it synthesizes: a ping waits for the whole inference.
        blocked = []
        for _ in range(2):
            parent.send({"op": "synthesize", "text": "x", "seconds": 0.1, "model_seconds": 2.0})
            time.sleep(0.2)
            began = time.perf_counter()
            parent.send({"op": "ping"})
            parent.receive()  # the audio
            parent.receive()  # the pong
            blocked.append(time.perf_counter() - began)
        results["ping_during_2s_inference_ms"] = summary(blocked)
    finally:
        parent.close()
    return results


# ------------------------------------------------------------------- the raw-pipe floor


def spawn_server(script: str) -> subprocess.Popen[bytes]:
    """Start one of this directory's servers on unbuffered pipes; returns once it wrote its ``R``."""
    process = subprocess.Popen(
        [sys.executable, os.path.join(HERE, script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=ENV,
        bufsize=0,
    )
    assert process.stdout is not None and process.stdout.read(1) == b"R"
    return process


class FloorParent:
    """A blocking parent of the raw-pipe child: a length prefix, then ``readinto`` a numpy array."""

    def __init__(self) -> None:
        self.process = spawn_server("_raw_pipe_server.py")
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout

    def request(self, seconds: float) -> np.ndarray:
        self.stdin.write(struct.pack("!I", int(seconds * 1000)))
        (size,) = struct.unpack("!I", self.stdout.read(4))
        out = np.empty(size // 2, dtype="<i2")
        view = memoryview(out).cast("B")
        got = 0
        while got < size:
            got += self.stdout.readinto(view[got:])  # type: ignore[operator]
        return out

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(10)
        self.stdout.close()


def floor_suite(repeat: int) -> dict[str, Any]:
    parent = FloorParent()
    try:
        echo = []
        for _ in range(repeat * 10):
            began = time.perf_counter()
            parent.request(0)
            echo.append(time.perf_counter() - began)
        return {"ping_idle_us": summary(echo, 1e6)}
    finally:
        parent.close()


# ---------------------------------------------------------------------------- ours


def sidecar_ready_suite(repeat: int) -> dict[str, Any]:
    """Spawn -> first frame read, with a plain subprocess parent (no client in the way)."""
    results: dict[str, Any] = {}
    for engine in ("fake", "espeak"):
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            process = subprocess.Popen(
                [sys.executable, "-m", "indextts_sidecar", "--engine", engine, "--log-level", "WARNING"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=ENV,
            )
            assert process.stdout is not None and process.stdin is not None
            (size,) = struct.unpack("!I", process.stdout.read(4))
            process.stdout.read(size)
            times.append(time.perf_counter() - began)
            process.stdin.close()
            process.wait(10)
            process.stdout.close()
        results[f"sidecar_{engine}_spawn_to_ready_ms"] = summary(times)
    bare = []
    for _ in range(repeat):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - began)
    results["python_c_pass_ms"] = summary(bare)
    return results


async def ours_suite(repeat: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    starts = []
    for _ in range(max(3, repeat // 3)):
        began = time.perf_counter()
        async with Client(engine="fake", env=ENV) as client:
            starts.append(time.perf_counter() - began)
            assert client.info.engine == "fake"
    results["spawn_to_ready_ms"] = summary(starts)
    async with Client(engine="fake", env=ENV, engine_options={"chunk_seconds": 60.0}) as client:
        await client.load()
        pings = []
        for _ in range(repeat * 10):
            health = await client.ping()
            pings.append(health.round_trip)
        results["ping_idle_us"] = summary(pings, 1e6)
        busy: list[float] = []
        async with anyio.create_task_group() as tg:
            started = anyio.Event()

            async def long_inference() -> None:
                # 2 s of compute in 40 chunks of 50 ms.
                await client.synthesize(
                    "x", seconds=2.0, chunk_seconds=0.05, delay=0.05, on_progress=lambda e: started.set()
                )

            tg.start_soon(long_inference)
            await started.wait()
            for _ in range(200):
                health = await client.ping()
                assert health.active is not None
                busy.append(health.round_trip)
        results["ping_during_2s_inference_us"] = summary(busy[:150], 1e6)
    return results


async def warm_suite(repeat: int, interleave: bool) -> dict[str, dict[str, Any]]:
    """Warm request -> int16 array for the three parents.

    In blocks (each parent's requests back to back, caches warm for it), or interleaved
    (the three take turns request by request: slow drifts of a shared machine hit all
    three alike, and so do the caches the others evicted).
    """
    results: dict[str, dict[str, Any]] = {"ours": {}, "seed": {}, "floor": {}}
    seed, floor = SeedParent(), FloorParent()
    try:
        async with Client(engine="fake", env=ENV, engine_options={"chunk_seconds": 60.0}) as client:
            await client.load()

            async def ours(seconds: float) -> np.ndarray:
                return (await client.synthesize("benchmark", seconds=seconds)).samples

            names = ("floor", "seed", "ours")
            for seconds in DURATIONS:
                times: dict[str, list[float]] = {"ours": [], "seed": [], "floor": []}
                if interleave:
                    schedule = [(round_, name) for round_ in range(repeat + 1) for name in names]
                else:
                    schedule = [(round_, name) for name in names for round_ in range(repeat + 1)]
                for round_, name in schedule:
                    began = time.perf_counter()
                    if name == "ours":
                        audio = await ours(seconds)
                    elif name == "seed":
                        audio = seed.synthesize(seconds)
                    else:
                        audio = floor.request(seconds)
                    elapsed = time.perf_counter() - began
                    assert len(audio) == seconds * RATE
                    if round_:  # the first round warms up
                        times[name].append(elapsed)
                for name, values in times.items():
                    results[name][f"warm_{seconds}s_ms"] = summary(values)
    finally:
        seed.close()
        floor.close()
    return results


def table(ours: dict[str, Any], seed: dict[str, Any], floor: dict[str, Any]) -> str:
    rows = [
        ("spawn -> ready (ms)", "spawn_to_ready_ms", "spawn_to_ready_ms", None),
        ("1 s audio, warm -> int16 array (ms)", "warm_1s_ms", "warm_1s_ms", "warm_1s_ms"),
        ("10 s audio, warm (ms)", "warm_10s_ms", "warm_10s_ms", "warm_10s_ms"),
        ("60 s audio, warm (ms)", "warm_60s_ms", "warm_60s_ms", "warm_60s_ms"),
        ("ping round trip, idle (us)", "ping_idle_us", "ping_idle_us", "ping_idle_us"),
        ("ping during a 2 s inference", "ping_during_2s_inference_us", "ping_during_2s_inference_ms", None),
    ]
    lines = ["| metric | this project | seed protocol | raw pipe floor |", "|---|---|---|---|"]
    for label, a, b, c in rows:
        cells = []
        for source, key in ((ours, a), (seed, b), (floor, c)):
            if key is None or key not in source:
                cells.append("—")
            else:
                unit = (
                    " ms"
                    if key.endswith("_ms") and "during" in key
                    else (" us" if key.endswith("_us") and "during" in key else "")
                )
                cells.append(fmt(source[key]) + unit)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    floor = floor_suite(args.repeat)
    seed = seed_suite(args.repeat)
    ours = anyio.run(ours_suite, args.repeat)
    warm = anyio.run(warm_suite, args.repeat, False)
    for name, column in (("ours", ours), ("seed", seed), ("floor", floor)):
        column.update(warm[name])
    mixed = anyio.run(warm_suite, args.repeat, True)
    ready = sidecar_ready_suite(args.repeat)
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs\n")
    print(table(ours, seed, floor))
    print()
    print("| spawn -> ready frame read, plain subprocess parent (ms) | median (min-max) |")
    print("|---|---|")
    print(f"| sidecar, engine fake | {fmt(ready['sidecar_fake_spawn_to_ready_ms'])} |")
    print(f"| sidecar, engine espeak | {fmt(ready['sidecar_espeak_spawn_to_ready_ms'])} |")
    print(f"| `python -c pass` | {fmt(ready['python_c_pass_ms'])} |")
    print("\nThe same warm requests, the three parents taking turns request by request:\n")
    print("| audio | this project | seed protocol | raw pipe floor |")
    print("|---|---|---|---|")
    for seconds in DURATIONS:
        key = f"warm_{seconds}s_ms"
        print(
            f"| {seconds} s (ms) | {fmt(mixed['ours'][key])} | {fmt(mixed['seed'][key])} | {fmt(mixed['floor'][key])} |"
        )
    for label, columns in (("in blocks", warm), ("interleaved", mixed)):
        ours60, seed60, floor60 = (columns[name]["warm_60s_ms"]["median"] for name in ("ours", "seed", "floor"))
        print(
            f"\n60 s audio, {label}: {seed60 / ours60:.1f}x faster than the seed protocol, "
            f"{ours60 / floor60:.2f}x the raw-pipe floor"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ours": ours, "seed": seed, "floor": floor, "ready": ready, "interleaved": mixed}, f, indent=2)


if __name__ == "__main__":
    main()

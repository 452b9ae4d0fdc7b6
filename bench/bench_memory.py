"""Client memory while receiving 10 minutes of audio, and the sidecar's spawn-to-ready time.

    .venv/bin/python bench/bench_memory.py [--seconds 600] [--runs 1]

Peak RSS is the kernel's high-water mark (VmHWM), reset just before the request by
writing 5 to /proc/self/clear_refs (Linux), so "above idle" is exactly what receiving
the audio cost the parent process.  The target: no more than 2x the audio's bytes.
"""

from __future__ import annotations

import argparse
import os
import platform

import anyio

from indextts_client import Client

RATE = 24000


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


async def measure(chunk_seconds: float, streaming: bool, seconds: int) -> dict[str, float]:
    async with Client(engine="fake", engine_options={"chunk_seconds": chunk_seconds}) as client:
        await client.load()
        await client.synthesize("memory", seconds=1.0)
        idle = _status("VmRSS")
        _reset_peak()
        samples = 0
        if streaming:
            async with client.stream("memory", seconds=seconds) as chunks:
                async for chunk in chunks:
                    samples += len(chunk.samples)
        else:
            audio = await client.synthesize("memory", seconds=seconds)
            samples = len(audio.samples)
        peak = _status("VmHWM")
        assert samples == seconds * RATE
        audio_bytes = samples * 2
        above = peak - idle
        return {"audio_mb": audio_bytes / 1e6, "above_idle_mb": above / 1e6, "ratio": above / audio_bytes}


async def main(seconds: int, runs: int) -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{seconds} s of {RATE} Hz int16 audio, {runs} run(s) each: ratio median (min-max)\n")
    print("| mode | engine chunk | audio (MB) | peak RSS above idle (MB) | ratio |")
    print("|---|---|---|---|---|")
    for streaming in (False, True):
        for chunk_seconds in (0.5, 60.0):
            results = [await measure(chunk_seconds, streaming, seconds) for _ in range(runs)]
            ratios = sorted(result["ratio"] for result in results)
            above = sorted(result["above_idle_mb"] for result in results)
            mode = "stream()" if streaming else "synthesize()"
            print(
                f"| {mode} | {chunk_seconds:g} s | {results[0]['audio_mb']:.1f} "
                f"| {above[len(above) // 2]:.1f} ({above[0]:.1f}-{above[-1]:.1f}) "
                f"| {ratios[len(ratios) // 2]:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600, help="audio per request")
    parser.add_argument("--runs", type=int, default=1, help="each measured this many times, each in a new client")
    args = parser.parse_args()
    anyio.run(main, args.seconds, args.runs)

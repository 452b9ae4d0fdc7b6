"""Client memory while receiving 10 minutes of audio, and the sidecar's spawn-to-ready time.

    .venv/bin/python bench/bench_memory.py

Peak RSS is the kernel's high-water mark (VmHWM), reset just before the request by
writing 5 to /proc/self/clear_refs (Linux), so "above idle" is exactly what receiving
the audio cost the parent process.  The target: no more than 2x the audio's bytes.
"""

from __future__ import annotations

import os
import platform

import anyio

from indextts_client import Client

SECONDS = 600
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


async def measure(chunk_seconds: float, streaming: bool) -> dict[str, float]:
    async with Client(engine="fake", engine_options={"chunk_seconds": chunk_seconds}) as client:
        await client.load()
        await client.synthesize("memory", seconds=1.0)
        idle = _status("VmRSS")
        _reset_peak()
        samples = 0
        if streaming:
            async with client.stream("memory", seconds=SECONDS) as chunks:
                async for chunk in chunks:
                    samples += len(chunk.samples)
        else:
            audio = await client.synthesize("memory", seconds=SECONDS)
            samples = len(audio.samples)
        peak = _status("VmHWM")
        assert samples == SECONDS * RATE
        audio_bytes = samples * 2
        above = peak - idle
        return {"audio_mb": audio_bytes / 1e6, "above_idle_mb": above / 1e6, "ratio": above / audio_bytes}


async def main() -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{SECONDS} s of {RATE} Hz int16 audio\n")
    print("| mode | engine chunk | audio (MB) | peak RSS above idle (MB) | ratio |")
    print("|---|---|---|---|---|")
    for streaming in (False, True):
        for chunk_seconds in (0.5, 60.0):
            result = await measure(chunk_seconds, streaming)
            mode = "stream()" if streaming else "synthesize()"
            print(
                f"| {mode} | {chunk_seconds:g} s | {result['audio_mb']:.1f} | {result['above_idle_mb']:.1f} "
                f"| {result['ratio']:.2f}x |"
            )


if __name__ == "__main__":
    anyio.run(main)

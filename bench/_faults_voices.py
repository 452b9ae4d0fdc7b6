"""The voice store's rows of bench_faults.py (docs/reliability.md, "Voices"): imported by it, not run alone.

Each scenario starts real sidecars with the fake engine and ``--voice-dir`` in a fresh
temporary directory, and registers real (tiny WAV) clips, as a client would.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Awaitable, Callable

import numpy as np
import soundfile

from indextts_client import Client, InvalidRequestError, Pool

QUIET = ["--log-level", "ERROR"]


def _clip(seed: int, seconds: float = 0.01) -> bytes:
    samples = np.random.default_rng(seed).uniform(-0.3, 0.3, round(seconds * 24000)).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, samples, 24000, format="WAV", subtype="PCM_16")
    return out.getvalue()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def _names_flood(repeat: int, attempts: int = 20_000) -> tuple[list[float], list[float], list[float]]:
    """One client registers ``attempts`` names (one clip): how many are taken, the sidecar's growth, the time."""
    taken, growth, seconds = [], [], []
    data = _clip(0)
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as voices:
            async with Client("fake", sidecar_args=[*QUIET, "--voice-dir", voices]) as client:
                await client.register_voice("warm", data)
                assert client.pid is not None
                before = _rss(client.pid)
                began, count = time.perf_counter(), 0
                for i in range(attempts):
                    try:
                        await client.register_voice(f"name-{i}", data)
                        count += 1
                    except InvalidRequestError as exc:
                        if "--max-voice-names" not in exc.message:
                            raise
                seconds.append(time.perf_counter() - began)
                growth.append((_rss(client.pid) - before) / 1e6)
                taken.append(float(count))
    return taken, growth, seconds


_FLOOD: dict[int, tuple[list[float], list[float], list[float]]] = {}


async def _flood_part(repeat: int, part: int) -> list[float]:
    if repeat not in _FLOOD:
        _FLOOD[repeat] = await _names_flood(repeat)
    return _FLOOD[repeat][part]


async def shared_voice_dir(repeat: int, requests: int = 20) -> list[float]:
    """Two pool members on one ``--voice-dir --max-voices 2``; each registers names; failed requests of ``requests``.

    Member 0 registers "bob", member 1 then tries "carol" (the store is full); then
    ``requests`` requests name "bob" on each member.  Issue 23 saw the first fail.
    """
    failures = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as voices:
            args = [*QUIET, "--voice-dir", voices, "--max-voices", "2"]
            async with Pool("fake", size=2, sidecar_args=args) as pool:
                first, second = pool.members
                await pool.register_voice("alice", _clip(1))
                await first.register_voice("bob", _clip(2))
                try:
                    await second.register_voice("carol", _clip(3))
                except InvalidRequestError:
                    pass
                failed = 0
                for i in range(requests):
                    try:
                        await (first, second)[i % 2].synthesize("bob", voice="registered:bob")
                    except InvalidRequestError:
                        failed += 1
                failures.append(float(failed))
    return failures


VOICE_SCENARIOS: dict[str, tuple[Callable[[int], Awaitable[list[float]]], str]] = {
    "20,000 voice names from one client": (lambda repeat: _flood_part(repeat, 0), "names taken"),
    "  the same: sidecar growth": (lambda repeat: _flood_part(repeat, 1), "MB sidecar RSS growth"),
    "  the same: time for the 20,000 calls": (lambda repeat: _flood_part(repeat, 2), "s"),
    "2 members, one --voice-dir, --max-voices 2": (shared_voice_dir, "of 20 requests for 'bob' failed"),
}


if __name__ == "__main__":
    import argparse
    import statistics

    import anyio

    parser = argparse.ArgumentParser(description="the voice rows of bench_faults.py alone")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    options = parser.parse_args()

    async def main() -> None:
        for name, (scenario, unit) in VOICE_SCENARIOS.items():
            values = await scenario(options.repeat)
            print(f"{name:50} median {statistics.median(values):8.3f}  max {max(values):8.3f}  {unit}", flush=True)

    anyio.run(main, backend=options.backend)

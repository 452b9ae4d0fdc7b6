"""The real upstream code path on the CPU: voice switching and time to first audio.

Runs IndexTTS-2 from the GitHub checkout on the conformance suite's tiny random model (it
speaks noise, but every step of upstream's pipeline runs), through a spawned sidecar and
the public client::

    INDEXTTS_UPSTREAM_PYTHON=$(python3 tests/upstream/build_venv.py github) \\
        .venv/bin/python bench/bench_upstream.py --rounds 5

* Voice switching: two sidecars side by side, one with the adapter's voice cache
  (``voice_cache=4``), one without (``voice_cache=0``: upstream's own one-slot cache,
  which recomputes on every switch).  Requests alternate between three voices and between
  the two sidecars, round after round; the first round is cold for both.
* Time to first audio: a three-segment text, streamed: when the first chunk arrives
  against when the whole request ends.

Prints medians with their min-max spread, and ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _upstream_env import upstream_env

from indextts_client import Client

ROOT = Path(__file__).resolve().parent.parent
FAST: dict[str, Any] = {"max_mel_tokens": 12, "num_beams": 1}
THREE = "Hello there. This is a test. We speak slowly."


def spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms ({min(values) * 1000:.0f}-{max(values) * 1000:.0f})"


def client(python: str, src: str, ckpt: Path, voice_cache: int) -> Client:
    return Client(
        "indextts2",
        python=python,
        engine_options={"model_dir": str(ckpt), "device": "cpu", "use_qwen_emo": False, "voice_cache": voice_cache},
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), src]), "HF_HUB_OFFLINE": "1"},
        ready_timeout=60,
        idle_timeout=300,
    )


async def run(python: str, src: str, ckpt: Path, rounds: int) -> None:
    voices = [str(ckpt / name) for name in ("voice.wav", "voice2.wav", "voice3.wav")]
    async with client(python, src, ckpt, 4) as cached, client(python, src, ckpt, 0) as plain:
        await cached.load()
        await plain.load()
        # Warm-up: upstream's first request is much slower than the rest; use a fourth clip.
        warm = str(ckpt / "warmup.wav")
        for c in (cached, plain):
            await c.synthesize("Hello.", voice=warm, **FAST)
        times: dict[tuple[str, int], list[float]] = {}
        for number in range(rounds):
            for voice in voices:
                order = (
                    (("cached", cached), ("plain", plain))
                    if number % 2 == 0
                    else (("plain", plain), ("cached", cached))
                )
                for label, c in order:
                    started = time.perf_counter()
                    await c.synthesize("Hello.", voice=voice, **FAST)
                    times.setdefault((label, min(number, 1)), []).append(time.perf_counter() - started)
        print("voice switching, three voices in turn (per request, median (min-max)):")
        for label in ("cached", "plain"):
            print(f"  {label:6}  first round {spread(times[(label, 0)])}  later rounds {spread(times[(label, 1)])}")
        ratios = [p / c for p, c in zip(times[("plain", 1)], times[("cached", 1)], strict=True)]
        later = statistics.median(times[("cached", 1)]) / statistics.median(times[("cached", 0)])
        print(
            f"  cached later/first round: {later:.2f}x;  plain/cached in later rounds: "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        )
        print(f"  voice cache: {(await cached.load())['voice_cache']}")

        first: list[float] = []
        total: list[float] = []
        for _ in range(rounds):
            started = time.perf_counter()
            arrived = None
            async with cached.stream(THREE, voice=voices[0], max_text_tokens_per_segment=6, **FAST) as chunks:
                async for _chunk in chunks:
                    if arrived is None:
                        arrived = time.perf_counter() - started
            total.append(time.perf_counter() - started)
            assert arrived is not None
            first.append(arrived)
        fractions = [f / t for f, t in zip(first, total, strict=True)]
        print("time to first audio, three segments, streamed:")
        print(
            f"  first chunk {spread(first)}  whole request {spread(total)}  "
            f"first/whole {statistics.median(fractions):.2f} ({min(fractions):.2f}-{max(fractions):.2f})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ckpt", help="an IndexTTS-2 fixture from tests/upstream/fixture.py (else built now)")
    args = parser.parse_args()
    found = upstream_env()
    if found is None:
        return 2
    python, src = found
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.ckpt) if args.ckpt else Path(tmp) / "ckpt"
        if not args.ckpt:
            fixture = [python, str(ROOT / "tests" / "upstream" / "fixture.py"), "2", str(ckpt), "--src", src]
            subprocess.run(fixture, check=True, capture_output=True)
        warm = ckpt / "warmup.wav"
        if not warm.exists():
            shutil.copyfile(ckpt / "voice3.wav", warm)  # another path: another cache key
        anyio.run(run, python, src, ckpt, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

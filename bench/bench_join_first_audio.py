"""Requests arriving one after another into an IndexTTS sidecar: joining a running batch or not.

Issue 33's case: requests that arrive while a batch runs.  With fixed batches
(``join_batches=false``) they wait for the running batch's end; with continuous batching they
join it at its next step.  Two sidecars of the same model (``max_batch`` = ``--requests``,
``--batch-wait-ms`` 0), run in the project's venv against upstream's::

    INDEXTTS_UPSTREAM_PYTHON=... .venv/bin/python bench/bench_join_first_audio.py 2 CKPT2 [--rounds 5] [--gap 0.3]

Each round sends ``--requests`` requests ``--gap`` seconds apart into one sidecar, then into the
other (alternating which goes first), and reads each request's first audio as the sidecar
measured it (from its arrival); a lone request's first audio, measured in each sidecar at the
start, is the yardstick.  The requests: greedy with a seed each, three segments (the tiny
models' segmenter), ``max_mel_tokens`` 12.  Prints per round and way the slowest first audio
over the lone one, the round's wall time, and the medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import anyio

from indextts_client import Audio, Client

ROOT = Path(__file__).resolve().parent.parent
TEXT = "Hello there. This is a test. We speak slowly."


def client(args: argparse.Namespace, joining: bool) -> Client:
    python = os.environ["INDEXTTS_UPSTREAM_PYTHON"]
    src = os.environ.get("INDEXTTS_UPSTREAM_SRC") or str(ROOT.parent / "shared" / "upstream" / "index-tts")
    options: dict[str, Any] = {
        "model_dir": args.ckpt,
        "device": "cpu",
        "max_batch": args.requests,
        "use_qwen_emo": False,
        "join_batches": joining,
    }
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), src]), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return Client(
        "indextts2" if args.version == "2" else "indextts2.5",
        python=python,
        engine_options=options,
        env=env,
        ready_timeout=120,
        idle_timeout=600,
    )


def request_options(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    segment = 6 if args.version == "2" else 20
    voice = str(Path(args.ckpt) / "voice.wav")
    return {
        "voice": voice,
        "seed": seed,
        "do_sample": False,
        "max_mel_tokens": 12,
        "max_text_tokens_per_segment": segment,
    }


async def arrivals(c: Client, args: argparse.Namespace) -> tuple[list[float], float]:
    """``--requests`` requests ``--gap`` s apart (a load schedule, not a synchronisation)."""
    firsts: list[float] = [0.0] * args.requests
    started = time.perf_counter()

    async def one(i: int) -> None:
        await anyio.sleep(i * args.gap)
        audio: Audio = await c.synthesize(TEXT, **request_options(args, i))
        first = audio.time_to_first_audio
        assert first is not None and audio.samples.size > 0
        firsts[i] = first

    async with anyio.create_task_group() as tg:
        for i in range(args.requests):
            tg.start_soon(one, i)
    return firsts, time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", choices=["2", "2.5"])
    parser.add_argument("ckpt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.3)
    args = parser.parse_args()
    async with client(args, True) as joined, client(args, False) as fixed:
        ways = {"joined": joined, "fixed": fixed}
        lone: dict[str, float] = {}
        for name, c in ways.items():
            await c.load()
            await c.synthesize(TEXT, **request_options(args, 99))  # warm-up
            firsts = []
            for _ in range(3):
                audio = await c.synthesize(TEXT, **request_options(args, 0))
                assert audio.time_to_first_audio is not None
                firsts.append(audio.time_to_first_audio)
            lone[name] = statistics.median(firsts)
            print(f"{name}: a lone request's first audio {lone[name]:.3f} s (median of 3)")
        ratios: dict[str, list[float]] = {name: [] for name in ways}
        walls: dict[str, list[float]] = {name: [] for name in ways}
        for number in range(args.rounds):
            order = list(ways) if number % 2 == 0 else list(ways)[::-1]
            for name in order:
                firsts, wall = await arrivals(ways[name], args)
                ratios[name].append(max(firsts) / lone[name])
                walls[name].append(wall)
                listed = " ".join(f"{f:.2f}" for f in firsts)
                slowest = ratios[name][-1]
                print(f"round {number} {name}: first audio {listed} s; slowest / lone {slowest:.2f}; wall {wall:.2f} s")
        for name in ways:
            r, w = ratios[name], walls[name]
            print(
                f"{name}: slowest first audio / lone, median {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}); "
                f"wall median {statistics.median(w):.2f} s ({min(w):.2f}-{max(w):.2f})"
            )


if __name__ == "__main__":
    anyio.run(main)

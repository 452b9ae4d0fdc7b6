"""The voice prefix cache's saving: a voice's second request's GPT prefill against its first's.

Runs in upstream's venv, the adapter in process on one loaded model (a fixture of
``tests/upstream/fixture.py``: tiny ``2``/``2.5``, or ``2-full``/``2.5-full``), the medium text
of ``bench_gpu.py``, upstream's decoding (three beams) cut at ``--tokens`` codes and one s2mel
step (the prefill does not depend on how many codes follow, nor on the stages after the GPT).
Each round, with the cache on (emptied first): the first request of a voice (it computes the
prefix) and the second (it reuses it); with the cache off (``prefix_cache=0``'s store): two
requests.  The prefill is what the adapter reports in
``done.facts["prefix_cache"]["prefill_s"]``: the emotion vector (``merge_emovec``), then
``inference_speech`` up to the end of the first forward pass of ``generate`` (the conditioning
and the prompt's prefill), summed over the request's segments (one here)::

    $(python3 tests/upstream/build_venv.py github) bench/bench_prefix_cache.py 2 CKPT_DIR --rounds 3

(``PYTHONPATH`` holding this checkout and upstream's.)  Prints a table and, with ``--json``,
writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from indextts_sidecar.engines import SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back to the woods."


def prefill(engine: Any, cls: Any, ckpt: str, tokens: int, number: int) -> dict[str, Any]:
    # One s2mel step: the stages after the GPT cost a full-size request a minute on a CPU, and the
    # prefill does not depend on them.
    base = {"max_mel_tokens": tokens, "first_segment_tokens": 0, "diffusion_steps": 1}
    options = msgspec.convert(base, cls.RequestOptions)
    request = SynthesisRequest(id=number, text=TEXT, voice=f"{ckpt}/voice.wav", emotion=None, options=options)
    started = time.perf_counter()
    for _ in engine.synthesize(request, lambda *a: None, lambda: False):
        pass
    wall = time.perf_counter() - started
    facts = engine.request_facts()["prefix_cache"]
    return {"prefill": facts["prefill_s"], "hits": facts["hits"], "wall": wall, "cache_bytes": engine._prefix.bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", choices=["2", "2.5"])
    parser.add_argument("ckpt")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cls = IndexTTS2Engine if args.version == "2" else IndexTTS25Engine
    engine = cls(msgspec.convert({"model_dir": args.ckpt, "device": "cpu", "use_qwen_emo": False}, cls.Options))
    started = time.perf_counter()
    engine.load(lambda *a: None, lambda: False)
    load = time.perf_counter() - started
    store, entries = engine._prefix, engine._prefix.entries
    prefill(engine, cls, args.ckpt, args.tokens, 0)  # upstream's first request is slower than the rest
    runs: dict[str, list[dict[str, Any]]] = {"on_first": [], "on_second": [], "off_first": [], "off_second": []}
    for number in range(args.rounds):
        order = ("on", "off") if number % 2 == 0 else ("off", "on")
        for mode in order:
            store.clear(problem=None)
            store.entries = entries if mode == "on" else 0
            runs[f"{mode}_first"].append(prefill(engine, cls, args.ckpt, args.tokens, 1))
            runs[f"{mode}_second"].append(prefill(engine, cls, args.ckpt, args.tokens, 2))
    assert all(r["hits"] == 1 for r in runs["on_second"]) and all(r["hits"] == 0 for r in runs["on_first"])
    medians = {name: statistics.median(r["prefill"] for r in values) for name, values in runs.items()}
    ratios = [s["prefill"] / f["prefill"] for f, s in zip(runs["on_first"], runs["on_second"], strict=True)]
    result = {
        "version": args.version,
        "ckpt": Path(args.ckpt).name,
        "threads": torch.get_num_threads(),
        "load_s": round(load, 1),
        "tokens": args.tokens,
        "rounds": args.rounds,
        "prefill_median_s": {name: round(value, 4) for name, value in medians.items()},
        "second_over_first": {"median": round(statistics.median(ratios), 3), "max": round(max(ratios), 3)},
        "bytes_per_voice": max(r["cache_bytes"] for r in runs["on_first"]),
        "runs": runs,
    }
    print(f"IndexTTS-{args.version} {Path(args.ckpt).name}, {result['threads']} threads, {args.rounds} rounds")
    print(f"{'GPT prefill (median s)':<28}{'first':>10}{'second':>10}")
    for mode, label in (("on", "prefix cache on"), ("off", "prefix cache off")):
        print(f"{label:<28}{medians[mode + '_first']:>10.4f}{medians[mode + '_second']:>10.4f}")
    print(f"second over first, cache on: median {result['second_over_first']['median']}, max {max(ratios):.3f}")
    print(f"one voice's prefix: {result['bytes_per_voice']} bytes")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    engine.unload()
    sys.stdout.flush()


if __name__ == "__main__":
    main()

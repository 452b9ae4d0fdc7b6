"""Run in an upstream venv: the voice prefix cache (``_prefix.py``), the adapter driven in process.

``probe_prefix.py VERSION CHECKPOINTS OUT`` writes ``OUT/report.json``.  Every request is greedy
(``do_sample=False``, a seed), so its GPT codes are a function of its inputs; the probe records
each request's codes (what ``inference_speech`` returned, row by row), the first logits they were
chosen from, its int16 samples, its ``done.facts`` and the engine's ``memory()`` (health) after it:

``off``
    ``prefix_cache=0``: a request at upstream's three beams, the same again, one at one beam;
``on``
    the same engine, its cache's bounds set to the defaults: the same three requests (cold, then
    warm), a second voice, and the first voice again in a batch of two (``max_batch=2``) beside
    the second voice;
``bounded``
    ``prefix_cache=1``: voice 1, voice 2, voice 1 (evicted by voice 2);
``bytes``
    a byte bound below one voice's keys and values: nothing of that kind is kept;
``unloaded``
    ``memory()`` after the unload: the cache reports nothing.
``tests/upstream/test_prefix_cache.py`` runs it and judges the results.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from probe_profile import engine_of  # a script beside this one: its folder is on the path

from indextts_sidecar.engines import BatchItem, ItemDone, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine
from indextts_sidecar.engines.indextts._options import PREFIX_CACHE_BYTES_DEFAULT
from indextts_sidecar.engines.indextts._prefix_store import KINDS

TEXT = "Hello there, how are you today."
OTHER = "The quick brown fox jumps."


class Codes:
    """The codes of each GPT decoding on one loaded model, row by row, and the first logits its
    ``mel_head`` gave (row 0, last position: what the first code is chosen from) as floats.

    A tiny random model's argmax hardly depends on the text: two texts may decode the same eight
    codes on one machine and not on another.  The logits always differ, so the tests judge whether
    an input reached the GPT by them."""

    def __init__(self, model: Any) -> None:
        self.seen: list[list[int]] = []
        self.logits: list[float] | None = None
        decode = model.gpt.inference_speech

        def first_logits(module: Any, args: Any, output: Any) -> None:
            if self.logits is None:
                self.logits = (output[0, -1] if output.dim() == 3 else output[0]).tolist()

        model.gpt.mel_head.register_forward_hook(first_logits)

        def inference_speech(*args: Any, **kwargs: Any) -> Any:
            out = decode(*args, **kwargs)
            codes = out[0] if isinstance(out, tuple) else out
            self.seen.extend(row.tolist() for row in codes)
            return out

        model.gpt.inference_speech = functools.wraps(decode)(inference_speech)

    def take(self) -> list[list[int]]:
        seen, self.seen = self.seen, []
        return seen

    def take_logits(self) -> list[float]:
        logits, self.logits = self.logits, None
        assert logits is not None, "the GPT's mel_head never ran"
        return logits


def request(cls: Any, ckpt: str, i: int, text: str = TEXT, voice: str = "voice.wav", **options: Any) -> Any:
    base = {"max_mel_tokens": 8, "do_sample": False, "seed": 1, "num_beams": 3, "first_segment_tokens": 0, **options}
    return SynthesisRequest(
        id=i, text=text, voice=f"{ckpt}/{voice}", emotion=None, options=msgspec.convert(base, cls.RequestOptions)
    )


def lone(engine: Any, codes: Codes, req: Any) -> dict[str, Any]:
    pieces = list(engine.synthesize(req, lambda *a: None, lambda: False))
    samples = np.concatenate([np.asarray(p, dtype=np.int16).reshape(-1) for p in pieces])
    return {
        "codes": codes.take(),
        "logits": codes.take_logits(),
        "samples": samples.tolist(),
        "facts": engine.request_facts(),
        "health": engine.memory(),
    }


def batch(engine: Any, codes: Codes, requests: list[Any]) -> dict[str, Any]:
    items = [BatchItem(r, lambda *a: None, lambda: False) for r in requests]
    samples: list[list[int]] = [[] for _ in requests]
    for index, value in engine.synthesize_batch(items):
        if isinstance(value, ItemDone):
            assert value.error is None, value.error
        else:
            samples[index].extend(np.asarray(value, dtype=np.int16).reshape(-1).tolist())
    codes.take_logits()
    return {"codes": codes.take(), "samples": samples, "health": engine.memory()}


def bounds(engine: Any, entries: int, max_bytes: int = PREFIX_CACHE_BYTES_DEFAULT) -> None:
    """The engine's prefix cache emptied, its counters zeroed and its bounds set, as a fresh
    engine's with those options would be (one load serves every phase: loads are the slow part)."""
    store = engine._prefix
    store.clear(problem=None)
    store.entries, store.max_bytes, store.evictions = entries, max_bytes, 0
    store.hits, store.misses = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)


def run(cls: Any, ckpt: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    three = [request(cls, ckpt, 0), request(cls, ckpt, 1), request(cls, ckpt, 2, text=OTHER, num_beams=1)]
    engine = engine_of(cls, ckpt, max_batch=2, prefix_cache=0)
    codes = Codes(engine._model)
    out["off"] = [lone(engine, codes, r) for r in three]
    out["off_info"] = engine.info()["prefix_cache"]

    bounds(engine, 8)
    out["on"] = [lone(engine, codes, r) for r in three]
    out["on"].append(lone(engine, codes, request(cls, ckpt, 3, voice="voice2.wav")))
    out["on_batch"] = batch(engine, codes, [request(cls, ckpt, 4), request(cls, ckpt, 5, voice="voice2.wav")])
    out["on_info"] = engine.info()["prefix_cache"]
    # loaded with the defaults: on (_gpt_fast.py, _s2mel_fast.py)
    out["speedups"] = {name: engine.info()[name] for name in ("gpt_speedups", "s2mel_speedups")}

    bounds(engine, 1)
    voices = ("voice.wav", "voice2.wav", "voice.wav")
    out["bounded"] = [lone(engine, codes, request(cls, ckpt, i, voice=v)) for i, v in enumerate(voices)]
    out["bounded_info"] = engine.info()["prefix_cache"]

    bounds(engine, 8, 4096)
    out["bytes"] = [lone(engine, codes, request(cls, ckpt, i)) for i in range(2)]
    out["bytes_info"] = engine.info()["prefix_cache"]
    engine.unload()
    out["unloaded"] = engine.memory()
    return out


def main() -> None:
    version, ckpt, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    torch.set_num_threads(1)
    cls = IndexTTS2Engine if version == "2" else IndexTTS25Engine
    # The tiny fixtures leave some weights to the constructors' random initialisation: seeded, every
    # load is the same model (test_gpt_fast.py's probe does the same).
    torch.manual_seed(0)
    report = run(cls, ckpt)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, default=str))
    print("ok")


if __name__ == "__main__":
    main()

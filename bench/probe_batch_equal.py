"""Each request of a batch against itself alone, in one process: the adapter driven directly.

Runs in upstream's venv with this repository and the GitHub checkout on ``PYTHONPATH``, on a
conformance fixture (``tests/upstream/fixture.py 2|2.5 DIR``)::

    PYTHONPATH=.:../shared/upstream/index-tts $INDEXTTS_UPSTREAM_PYTHON bench/probe_batch_equal.py 2 DIR

Three greedy requests with a seed each (two voices, several segments): each alone through
``synthesize()``, then the three through ``synthesize_batch()``; prints, per request, its
samples, the largest difference (int16 steps) and how many samples differ, and both wall times.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import msgspec
import numpy as np

from indextts_sidecar.engines import BatchItem, ItemDone, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine


def main() -> int:
    version, ckpt = sys.argv[1], sys.argv[2]
    cls = IndexTTS2Engine if version == "2" else IndexTTS25Engine
    options = {"model_dir": ckpt, "device": "cpu", "use_qwen_emo": False, "max_batch": 8}
    engine: Any = cls(msgspec.convert(options, cls.Options))
    engine.load(lambda *a: None, lambda: False)
    segment = 6 if version == "2" else 20
    jobs = [
        ("Hello there.", "voice.wav", 1),
        ("This is a test. We speak slowly.", "voice2.wav", 2),
        ("One two three. Hello there.", "voice.wav", 3),
    ]
    requests = [
        SynthesisRequest(
            id=i,
            text=text,
            voice=f"{ckpt}/{voice}",
            emotion=None,
            options=msgspec.convert(
                {"do_sample": False, "seed": seed, "max_mel_tokens": 12, "max_text_tokens_per_segment": segment},
                cls.RequestOptions,
            ),
        )
        for i, (text, voice, seed) in enumerate(jobs)
    ]
    started = time.perf_counter()
    alone = [np.concatenate(list(engine.synthesize(r, lambda *a: None, lambda: False))) for r in requests]
    alone_wall = time.perf_counter() - started
    pieces: dict[int, list[Any]] = {i: [] for i in range(len(requests))}
    started = time.perf_counter()
    items = [BatchItem(r, lambda *a: None, lambda: False) for r in requests]
    for index, chunk in engine.synthesize_batch(items):
        if isinstance(chunk, ItemDone):
            assert chunk.error is None, chunk.error
        else:
            pieces[index].append(chunk)
    batch_wall = time.perf_counter() - started
    print(f"model {version}: alone one after another {alone_wall:.1f} s, as one batch {batch_wall:.1f} s")
    for i, a in enumerate(alone):
        b = np.concatenate(pieces[i])
        if a.shape != b.shape:
            print(f"request {i}: {a.size} samples alone, {b.size} batched")
            continue
        difference = np.abs(a.astype(np.int32) - b.astype(np.int32))
        print(
            f"request {i}: {a.size} samples, max difference {int(difference.max())}, "
            f"{int(np.count_nonzero(difference))} differ"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

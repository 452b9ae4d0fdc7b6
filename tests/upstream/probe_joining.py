"""Run in an upstream venv: requests joining a running batch, the adapter driven in process.

``probe_joining.py VERSION CHECKPOINTS OUT`` loads the engine (``max_batch=4``, joining on)
and runs three greedy requests with a seed each, three ways:

* ``alone``: each through ``synthesize()``, upstream's own generator by itself;
* ``lone``: each through ``synthesize_batch()`` as a batch of one (what the sidecar now runs
  for a lone request), nobody joining;
* ``joined``: the first (three segments or more) as a batch of one, the second joining when
  the first has its first segment out (at its 2nd), the third when it has two (at its 3rd).

Writes each audio as ``OUT/<way>-<i>.npy`` (int16) and ``OUT/report.json``: per way and
request, the progress messages, the ``request_facts()`` read right after its end, and (for
``joined``) the order of events: which item yielded audio or ended, step by step.
``tests/upstream/test_upstream_joining.py`` runs it and judges the results.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from indextts_sidecar.engines import BatchItem, ItemDone, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine


def requests(cls: Any, ckpt: str, version: str) -> list[SynthesisRequest[Any]]:
    segment = 6 if version == "2" else 20  # 2.5's tiny tokenizer: about a token a character
    jobs = [
        ("Hello there. This is a test. We speak slowly. One two three.", "voice.wav", 2),
        ("We speak slowly and clearly.", "voice2.wav", 3),
        ("Hello there, one two three.", "voice.wav", 5),  # the first's voice: the shared memo
    ]
    options = {"do_sample": False, "max_mel_tokens": 12, "max_text_tokens_per_segment": segment}
    return [
        SynthesisRequest(
            id=i,
            text=text,
            voice=f"{ckpt}/{voice}",
            emotion=None,
            options=msgspec.convert({**options, "seed": seed}, cls.RequestOptions),
        )
        for i, (text, voice, seed) in enumerate(jobs)
    ]


class Record:
    """One request's progress messages and audio."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.pieces: list[np.ndarray] = []
        self.facts: dict[str, Any] = {}

    def progress(self, stage: str, fraction: Any = None, message: str = "") -> None:
        if message:
            self.messages.append(message)

    def ready(self) -> int:
        return sum(1 for m in self.messages if m.startswith("segment ") and " ready (" in m)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.pieces) if self.pieces else np.zeros(0, np.int16)


def run_batch(
    engine: Any,
    items: Sequence[BatchItem[Any]],
    records: dict[int, Record],
    join: Callable[[int], Sequence[BatchItem[Any]]],
    order: list[str],
) -> None:
    for index, value in engine.synthesize_batch(items, join):
        record = records[index]
        if isinstance(value, ItemDone):
            if value.error is not None:
                raise RuntimeError(f"item {index} failed: {value.error}")
            record.facts = engine.request_facts()
            order.append(f"end {index}")
        else:
            record.pieces.append(np.frombuffer(memoryview(value).cast("B"), dtype="<i2").copy())
            order.append(f"audio {index}")


def main() -> int:
    version, ckpt, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cls = IndexTTS2Engine if version == "2" else IndexTTS25Engine
    options = {"model_dir": ckpt, "device": "cpu", "use_qwen_emo": False, "max_batch": 4}
    engine: Any = cls(msgspec.convert(options, cls.Options))
    engine.load(lambda *a: None, lambda: False)
    assert engine.joins_batches
    jobs = requests(cls, ckpt, version)
    report: dict[str, Any] = {}

    alone = [Record() for _ in jobs]
    for request, record in zip(jobs, alone, strict=True):
        engine.check(request)
        record.pieces = list(engine.synthesize(request, record.progress, lambda: False))
        record.facts = engine.request_facts()

    lone = [Record() for _ in jobs]
    joins: list[int] = []
    for request, record in zip(jobs, lone, strict=True):
        item = BatchItem(request, record.progress, lambda: False)

        def nobody(room: int) -> list[BatchItem[Any]]:
            joins.append(room)
            return []

        run_batch(engine, [item], {0: record}, nobody, [])

    joined = {i: Record() for i in range(len(jobs))}
    order: list[str] = []
    rooms: list[int] = []
    waiting = [1, 2]  # the second joins at the first's 2nd segment, the third at its 3rd

    def join(room: int) -> list[BatchItem[Any]]:
        rooms.append(room)
        if waiting and joined[0].ready() >= waiting[0]:
            index = waiting.pop(0)
            order.append(f"join {index}")
            return [BatchItem(jobs[index], joined[index].progress, lambda: False)]
        return []

    run_batch(engine, [BatchItem(jobs[0], joined[0].progress, lambda: False)], joined, join, order)

    out.mkdir(parents=True, exist_ok=True)
    for way, records in (("alone", alone), ("lone", lone), ("joined", [joined[i] for i in range(len(jobs))])):
        report[way] = [{"messages": r.messages, "facts": r.facts, "ready": r.ready()} for r in records]
        for i, record in enumerate(records):
            np.save(out / f"{way}-{i}.npy", record.audio())
    report["order"] = order
    report["rooms"] = rooms
    report["lone_join_calls"] = joins
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

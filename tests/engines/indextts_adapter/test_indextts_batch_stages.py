"""Which stages of a batch run batched (engine option ``batch_stages``), without torch or upstream.

The coordinator runs plain generators shaped like upstream's ``infer``: per segment a GPT call,
the GPT's latent pass, a CFM call and a vocoder call, each parked through the interceptors'
context, then the segment's audio.  The batched calls are ``run_calls``' (torch), replaced by
one that records which calls ran together and when; with ``gpt`` the GPT's decoding runs
grouped and each request's latent pass, CFM and vocoder run alone, its audio out before the
next request's latent pass.  The real
calls are tested against upstream in tests/upstream/test_upstream_batching.py (``auto``, which
is ``gpt`` on the CPU, and ``all``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec
import numpy as np
import pytest
from indextts_support import make_request, never

from indextts_sidecar.engines import BatchItem, ItemDone
from indextts_sidecar.engines.indextts import IndexTTS2Engine
from indextts_sidecar.engines.indextts import _batch_run as batch_run
from indextts_sidecar.engines.indextts._batch_run import BatchRun
from indextts_sidecar.engines.indextts._batched import current
from indextts_sidecar.engines.indextts._install import Flavour
from indextts_sidecar.engines.indextts._lockstep import Call
from indextts_sidecar.engines.indextts._segments import SegmentTexts
from indextts_sidecar.engines.indextts._voice_cache import VoiceCache

FLAVOUR = Flavour(kind="2", module="indextts.infer_v2", location=None)
KINDS = ("gpt", "latent", "cfm", "vocoder")


class Model:
    """``infer(text=...)``: a segment per word, each a GPT, a latent, a CFM and a vocoder call, then its audio."""

    def infer(self, text: str, **kwargs: Any) -> Iterator[Any]:
        name = text.split()[0]
        for step in range(len(text.split()) - 1):
            context = current()
            assert context is not None and context.batch is not None
            value = 0
            for kind in KINDS:
                value += context.batch.park(Call(kind, kind, (name, step), {}))
            yield np.full(3, value, dtype=np.float32)
            yield np.zeros(1, dtype=np.float32)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each run of calls (``kind name:step,...``) and each chunk out (``audio name``), in order."""
    seen: list[str] = []

    def run_calls(hooks: Any, calls: Sequence[Call], heartbeat: Callable[[str], Any]) -> None:
        seen.append(f"{calls[0].kind} " + ",".join(f"{c.args[0]}:{c.args[1]}" for c in calls))
        for call in calls:
            call.result = 10 * (KINDS.index(call.kind) + 1) + call.args[1]  # its own row, whatever its company

    monkeypatch.setattr(batch_run, "run_calls", run_calls)
    return seen


def item(text: str) -> BatchItem[Any]:
    return BatchItem(make_request(IndexTTS2Engine, "v.wav", text=text), _ignore, never)


def run(
    texts: list[str], stages: str, log: list[str], join: Callable[[int], list[BatchItem[Any]]] | None = None
) -> tuple[dict[int, list[int]], BatchRun]:
    items = [item(text) for text in texts]
    batch = BatchRun(
        Model(),
        FLAVOUR,
        items,
        prepare=lambda request: {"text": request.text},
        voices=VoiceCache(0),
        segment_texts=SegmentTexts(),
        batch_vocoder=True,
        max_batch=4,
        join=join,
        batch_stages=stages,
    )
    audio: dict[int, list[int]] = {}
    try:
        for index, value in batch.run(None):  # type: ignore[arg-type]
            name = batch.members[index].item.request.text.split()[0]  # a joiner's too
            if isinstance(value, ItemDone):
                assert value.error is None
                log.append(f"end {name}")
            elif value.any():
                audio.setdefault(index, []).extend(int(v) for v in value)
                log.append(f"audio {name}")
    finally:
        batch.close()
    return audio, batch


def _ignore(*args: Any) -> None:
    pass


def test_with_gpt_the_gpt_runs_grouped_and_each_request_speaks_as_soon_as_its_own_rows_are_done(
    log: list[str],
) -> None:
    texts = ["a x y", "b x", "c x y"]
    audio, batch = run(texts, "gpt", log)
    assert log[:12] == [
        "gpt a:0,b:0,c:0",
        "latent a:0",  # a's latent pass alone: its CFM need not wait for b's and c's rows
        "cfm a:0",
        "vocoder a:0",
        "audio a",  # a's first audio, before b's latent pass runs
        "latent b:0",
        "cfm b:0",
        "vocoder b:0",
        "audio b",
        "end b",
        "latent c:0",
        "cfm c:0",
    ]
    assert log[12:] == [
        "vocoder c:0",
        "audio c",
        "gpt a:1,c:1",  # those that go on decode their next segment together
        "latent a:1",
        "cfm a:1",
        "vocoder a:1",
        "audio a",
        "end a",
        "latent c:1",
        "cfm c:1",
        "vocoder c:1",
        "audio c",
        "end c",
    ]
    alone = {i: run([text], "gpt", [])[0][0] for i, text in enumerate(texts)}
    assert audio == alone  # each request's rows are its own
    assert batch.facts(0)["batch_stages"] == "gpt"


def test_with_gpt_a_joiner_runs_its_rows_before_those_already_speaking(log: list[str]) -> None:
    # j arrives while a speaks its first segment: its codes are decoded beside a's next segment's,
    # then its latent pass, CFM and vocoder run before a's, since a's audio is already out.
    arrivals = [[], [item("j x")]]

    def join(room: int) -> list[BatchItem[Any]]:
        return arrivals.pop(0) if arrivals else []

    audio, _ = run(["a x y"], "gpt", log, join)
    assert log == [
        "gpt a:0",
        "latent a:0",
        "cfm a:0",
        "vocoder a:0",
        "audio a",
        "gpt a:1,j:0",  # j joined once a's first GPT call was done
        "latent j:0",  # j has nothing out yet: its rows first
        "cfm j:0",
        "vocoder j:0",
        "audio j",
        "end j",
        "latent a:1",
        "cfm a:1",
        "vocoder a:1",
        "audio a",
        "end a",
    ]
    assert audio == {0: [100] * 3 + [104] * 3, 1: [100] * 3}


def test_with_all_every_stage_runs_grouped(log: list[str]) -> None:
    audio, batch = run(["a x y", "b x"], "all", log)
    assert log[:6] == ["gpt a:0,b:0", "latent a:0,b:0", "cfm a:0,b:0", "vocoder a:0,b:0", "audio a", "audio b"]
    assert audio == {0: [100] * 3 + [104] * 3, 1: [100] * 3}
    assert batch.facts(1)["batch_stages"] == "all"


def test_batch_stages_is_an_engine_option_and_auto_follows_the_device() -> None:
    options = IndexTTS2Engine.Options
    assert msgspec.convert({}, options).batch_stages == "auto"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"batch_stages": "cfm"}, options)
    cpu = IndexTTS2Engine(msgspec.convert({"device": "cpu"}, options))
    assert cpu.batch_stages() == "gpt"
    gpu = IndexTTS2Engine(msgspec.convert({"device": "cuda:0"}, options))
    assert gpu.batch_stages() == "all"
    chosen = IndexTTS2Engine(msgspec.convert({"device": "cpu", "batch_stages": "all"}, options))
    assert chosen.batch_stages() == "all"

"""Requests joining a running batch (``_batch_run.py``), without torch or upstream.

The coordinator runs plain generators shaped like upstream's ``infer``: one model call parked
per segment (through the interceptors' context, as upstream's GPT call is), then the segment's
audio and its silence.  The batched calls themselves are ``run_calls``' (torch), replaced here
by one that records which requests shared each round; their real counterpart is tested against
upstream in tests/upstream/test_upstream_joining.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from indextts_support import make_request, never

from indextts_sidecar.engines import BatchItem, EngineError, ItemDone, RequestError
from indextts_sidecar.engines.indextts import IndexTTS2Engine
from indextts_sidecar.engines.indextts import _batch_run as batch_run
from indextts_sidecar.engines.indextts._batch_run import BatchRun
from indextts_sidecar.engines.indextts._batched import current
from indextts_sidecar.engines.indextts._install import Flavour
from indextts_sidecar.engines.indextts._lockstep import Call
from indextts_sidecar.engines.indextts._segments import SegmentTexts
from indextts_sidecar.engines.indextts._voice_cache import VoiceCache

FLAVOUR = Flavour(kind="2", module="indextts.infer_v2", location=None)


class Model:
    """``infer(text=...)``: a segment per word, each a parked call, then its audio and a silence."""

    def infer(self, text: str, **kwargs: Any) -> Iterator[Any]:
        if text.startswith("broken"):
            raise OSError("the reference cannot be read")
        for step in range(len(text.split())):
            context = current()
            assert context is not None and context.batch is not None
            value = context.batch.park(Call("gpt", "same", (text, step), {}))
            yield np.full(4, value, dtype=np.float32)
            yield np.zeros(2, dtype=np.float32)


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each round's parked calls (``text:step``), run by a stand-in for the batched calls."""
    seen: list[list[str]] = []

    def run_calls(hooks: Any, calls: Sequence[Call], heartbeat: Callable[[str], Any]) -> None:
        seen.append([f"{call.args[0].split()[0]}:{call.args[1]}" for call in calls])
        for call in calls:
            call.result = 100 * (len(call.args[0]) % 7 + 1) + call.args[1]  # its own row, whatever its company

    monkeypatch.setattr(batch_run, "run_calls", run_calls)
    return seen


class Recorder:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def __call__(self, stage: str, fraction: Any = None, message: str = "") -> None:
        self.messages.append(message)


def item(voice: str, text: str, cancelled: Callable[[], bool] = never) -> BatchItem[Any]:
    return BatchItem(make_request(IndexTTS2Engine, voice, text=text), Recorder(), cancelled)


def prepare(request: Any) -> dict[str, Any]:
    if request.text.startswith("refused"):
        raise RequestError("refused at once", field="$.options.seed")
    return {"text": request.text}


def run(
    items: Sequence[BatchItem[Any]], join: Callable[[int], Sequence[BatchItem[Any]]] | None, max_batch: int = 4
) -> tuple[dict[int, list[int]], dict[int, Any], list[str], BatchRun]:
    batch = BatchRun(
        Model(),
        FLAVOUR,
        items,
        prepare=prepare,
        voices=VoiceCache(4),
        segment_texts=SegmentTexts(),
        batch_vocoder=True,
        max_batch=max_batch,
        join=join,
    )
    audio: dict[int, list[int]] = {}
    ends: dict[int, Any] = {}
    order: list[str] = []
    try:
        for index, value in batch.run(None):  # type: ignore[arg-type]
            assert index not in ends, "a chunk after its end"
            if isinstance(value, ItemDone):
                ends[index] = value
                order.append(f"end {index}")
            else:
                audio.setdefault(index, []).extend(int(v) for v in value)
    finally:
        batch.close()
    return audio, ends, order, batch


def alone(voice: str, text: str, rounds: list[list[str]]) -> list[int]:
    audio, ends, _, _ = run([item(voice, text)], None)
    rounds.clear()
    assert ends[0].error is None
    return audio[0]


def test_requests_join_at_the_top_of_a_round_numbered_on_and_get_their_own_rows(
    voice: str, rounds: list[list[str]]
) -> None:
    texts = ["first a b c d", "second e", "third f g"]
    expected = [alone(voice, text, rounds) for text in texts]
    first = item(voice, texts[0])
    joiners = [item(voice, texts[1]), item(voice, texts[2])]
    joined = list(joiners)
    offered: list[int] = []

    def join(room: int) -> list[BatchItem[Any]]:
        offered.append(room)
        # The second joins before the first's first call runs, the third before its second.
        return [joiners.pop(0)] if joiners and len(offered) in (1, 2) else []

    audio, ends, order, batch = run([first], join)
    assert [audio[i] for i in range(3)] == expected  # each as alone
    assert all(ends[i].error is None for i in range(3))
    # The joiner's first call ran in the round it joined, beside the first's next one.
    assert rounds[:3] == [["first:0", "second:0"], ["first:1", "second:1", "third:0"], ["first:2", "third:1"]]
    assert offered[:3] == [3, 2, 2]  # max_batch 4 less those running (the second ended after two)
    assert order.index("end 1") < order.index("end 0")
    notes = [[m for m in it.progress.messages if "batch" in m] for it in (first, *joined)]  # type: ignore[attr-defined]
    assert notes == [[], ["joined a batch of 2"], ["joined a batch of 3"]]
    assert batch.given == 3 and batch.facts(2)["voice_cache"] in ("hit", "miss")


def test_a_lone_request_says_nothing_of_batches_and_keeps_its_facts(voice: str, rounds: list[list[str]]) -> None:
    lone = item(voice, "lone a b")
    asked: list[int] = []

    def nobody(room: int) -> list[BatchItem[Any]]:
        asked.append(room)
        return []

    _, ends, _, batch = run([lone], nobody)
    assert ends[0].error is None
    messages = lone.progress.messages  # type: ignore[attr-defined]
    assert not [m for m in messages if "batch" in m], messages
    assert "segment 3 ready (0.00 s of audio)" in messages and messages[-1].startswith("3 segments")
    assert asked == [3, 3, 3]  # asked once a round
    assert batch.facts(0)["voice_cache"] == "miss"


def test_joiners_that_fail_at_once_or_were_cancelled_end_alone_and_the_batch_goes_on(
    voice: str, rounds: list[list[str]]
) -> None:
    expected = alone(voice, "first a b c", rounds)
    waiting = [[item(voice, "refused x"), item(voice, "gone y", lambda: True)], [item(voice, "broken z")]]

    def join(room: int) -> list[BatchItem[Any]]:
        return waiting.pop(0) if waiting else []

    audio, ends, _, _ = run([item(voice, "first a b c")], join)
    assert audio[0] == expected and ends[0].error is None
    assert isinstance(ends[1].error, RequestError) and ends[1].error.field == "$.options.seed"
    assert ends[2].error is None and 2 not in audio  # cancelled before it started: no audio
    assert isinstance(ends[3].error, EngineError) and "preparing the references failed" in str(ends[3].error)
    assert set(ends) == {0, 1, 2, 3}


def test_a_join_past_the_room_left_is_a_sidecar_bug(voice: str, rounds: list[list[str]]) -> None:
    def greedy(room: int) -> list[BatchItem[Any]]:
        return [item(voice, f"extra{i} a") for i in range(room + 1)]

    with pytest.raises(EngineError, match="2 requests joined a batch with room for 1"):
        run([item(voice, "first a b")], greedy, max_batch=2)


def test_joiners_say_so_and_the_shared_per_voice_results_stay_bounded(voice: str, rounds: list[list[str]]) -> None:
    joiner = item(voice, "second a")
    waiting = [joiner]
    holder: list[BatchRun] = []
    offered: list[int] = []

    def join(room: int) -> list[BatchItem[Any]]:
        memo = holder[0].memo
        for _ in range(3):  # entries of requests that came and went
            memo[("merge_emovec", len(offered))] = None
            offered.append(room)
        return [waiting.pop()] if waiting else []

    first = item(voice, "first a b c")
    batch = BatchRun(
        Model(),
        FLAVOUR,
        [first],
        prepare=prepare,
        voices=VoiceCache(4),
        segment_texts=SegmentTexts(),
        batch_vocoder=True,
        max_batch=4,
        join=join,
    )
    holder.append(batch)
    try:
        ends = [value for _, value in batch.run(None) if isinstance(value, ItemDone)]  # type: ignore[arg-type]
    finally:
        batch.close()
    assert len(ends) == 2 and all(end.error is None for end in ends)
    assert "joined a batch of 2" in joiner.progress.messages  # type: ignore[attr-defined]
    assert not [m for m in first.progress.messages if "batch" in m]  # type: ignore[attr-defined]
    assert len(offered) >= 9  # without a bound, the memo would hold as many entries
    assert len(batch.memo) <= 4 + 3  # cleared whenever it holds more than max_batch

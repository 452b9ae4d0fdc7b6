"""The fake engine validates what real engines validate, so tests of the client meet real refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import anyio
import msgspec
import pytest
from client_support import expected, fake_client

from indextts_client import EngineError, InvalidRequestError
from indextts_sidecar.engines import BatchItem, ItemDone, SynthesisRequest, Words, WordSpan
from indextts_sidecar.engines import EngineError as EngineFailure
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions, FakeRequestOptions, render_bytes, words

pytestmark = pytest.mark.anyio


async def test_the_fake_engine_rejects_what_real_engines_reject(tmp_path: Path) -> None:
    clip = tmp_path / "speaker.wav"
    clip.write_bytes(b"RIFF a stand-in clip")
    nan = float("nan")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"text": ""}, "$.text", "text is empty"),
        ({"text": " \n\t"}, "$.text", "text is empty"),
        ({"emotion": {"happy": 5.0}}, "$.emotion.happy", "must be in [0, 1], got 5.0"),
        ({"emotion": {"sad": -1.0}}, "$.emotion.sad", "must be in [0, 1], got -1.0"),
        ({"emotion": {"calm": nan}}, "$.emotion.calm", "got nan"),
        ({"emotion": {"happy": 0.7, "sad": 0.7}}, "$.emotion", "sum to 1.4"),
        ({"emotion": {"happy": 0.5, "alpha": nan}}, "$.emotion.alpha", "got nan"),
        ({"voice": str(tmp_path / "nobody.wav")}, "$.voice", "does not exist"),
        ({"emotion": {"kind": "audio", "path": str(tmp_path)}}, "$.emotion.path", "is a directory"),
    ]
    with anyio.fail_after(30):
        async with fake_client() as client:
            for kwargs, field, fragment in cases:
                text = kwargs.pop("text", "x")
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize(text, **kwargs)
                assert caught.value.code == "invalid_input", kwargs
                assert caught.value.detail["field"] == field and fragment in caught.value.message, caught.value
            audio = await client.synthesize("ok", voice=str(clip), emotion={"happy": 0.6, "calm": 0.4})
            assert audio.samples.tobytes() == expected("ok")
        # validate=false: the old, permissive double, with its fault injection.
        async with fake_client(engine_options={"validate": False}) as client:
            permissive = await client.synthesize("", voice="anything", emotion={"happy": 5.0})
            assert permissive.samples.tobytes() == expected("")  # empty text renders one blank's tone
            with pytest.raises(EngineError) as failed:
                await client.synthesize("", fail_at=0)
            assert failed.value.code == "engine_error"


# ------------------------------------------------------------------ batch mode


def _engine(**options: Any) -> FakeEngine:
    engine = FakeEngine(msgspec.convert({"sample_rate": 8000, "seconds_per_char": 0.01, **options}, FakeOptions))
    engine.load(lambda *args: None, lambda: False)
    return engine


def _request(request_id: int, text: str, **options: Any) -> SynthesisRequest[FakeRequestOptions]:
    opts = msgspec.convert({"chunk_seconds": 0.02, **options}, FakeRequestOptions)
    return SynthesisRequest(id=request_id, text=text, voice=None, emotion=None, options=opts)


def _item(request: SynthesisRequest[FakeRequestOptions], flag: list[bool], seen: list[str]) -> BatchItem[Any]:
    def progress(stage: str, fraction: Union[float, None] = None, message: str = "") -> None:
        seen.append(message)

    return BatchItem(request=request, progress=progress, cancelled=lambda: flag[0])


def test_max_batch_is_the_engine_option_and_one_by_default() -> None:
    assert _engine().max_batch == 1
    assert _engine(max_batch=4).max_batch == 4
    with pytest.raises(msgspec.ValidationError):
        _engine(max_batch=0)


def test_each_request_of_a_batch_gets_exactly_its_audio_and_progress_alone() -> None:
    engine = _engine(max_batch=3)
    requests = [_request(1, "one"), _request(2, "a longer text here"), _request(3, "mid length")]
    alone = {}
    alone_progress = {}
    for request in requests:
        seen: list[str] = []
        chunks = list(engine.synthesize(request, lambda _s, _f=None, m="", seen=seen: seen.append(m), lambda: False))
        alone[request.id] = _timeline(chunks)
        alone_progress[request.id] = seen
    progress: dict[int, list[str]] = {r.id: [] for r in requests}
    items = [_item(r, [False], progress[r.id]) for r in requests]
    got: dict[int, list[Any]] = {r.id: [] for r in requests}
    ended: list[int] = []
    for index, value in engine.synthesize_batch(items):
        request_id = requests[index].id
        assert request_id not in ended, "a chunk after the item's ItemDone"
        if isinstance(value, ItemDone):
            assert value.error is None
            ended.append(request_id)
        else:
            got[request_id].append(value)
    assert ended == [1, 3, 2]  # the shortest ends first, each at once after its last chunk
    for request in requests:
        audio, spoken = _timeline(got[request.id])
        assert (audio, spoken) == alone[request.id]
        assert audio == render_bytes(request.text, 8000, seconds_per_char=0.01)
        assert spoken == words(request.text, 8000, seconds_per_char=0.01)
        assert [request.text[w.start_char : w.end_char] for w in spoken] == request.text.split()
        assert progress[request.id] == alone_progress[request.id]


def _timeline(values: list[Any]) -> tuple[bytes, list[WordSpan]]:
    """The audio of an engine's yields, and its words, each checked to come before the chunk
    that holds its first sample (and after the chunks before that one)."""
    audio = bytearray()
    spoken: list[WordSpan] = []
    for value in values:
        if isinstance(value, Words):
            for word in value.words:
                assert word.start >= len(audio) // 2, (word, len(audio) // 2)
            spoken += value.words
        else:
            audio += memoryview(value).cast("B")
            assert all(word.start < len(audio) // 2 for word in spoken)
    return bytes(audio), spoken


def test_a_batch_pays_the_simulated_compute_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from indextts_sidecar.engines import fake

    slept: list[float] = []
    monkeypatch.setattr(fake, "_sleep_unless", lambda seconds, stop: slept.append(seconds) or True)
    engine = _engine(max_batch=4)
    requests = [_request(i, "abcd" * i, delay=0.25 * i) for i in (1, 2, 3)]  # 2, 4 and 6 chunks
    items = [_item(r, [False], []) for r in requests]
    list(engine.synthesize_batch(items))
    # Six steps; each pays the longest delay of the requests still in the batch, once.
    assert slept == [0.75] * 6


def test_a_batch_drops_a_cancelled_request_and_fails_only_the_one_that_fails() -> None:
    engine = _engine(max_batch=4)
    requests = [
        _request(1, "keeps going on"),
        _request(2, "is cancelled", hang_at=1),
        _request(3, "fails here", fail_at=2, fail_message="item three broke"),
    ]
    flags = [[False], [False], [False]]
    items = [_item(r, flag, []) for r, flag in zip(requests, flags, strict=True)]
    got: dict[int, bytearray] = {1: bytearray(), 2: bytearray(), 3: bytearray()}
    done: dict[int, Any] = {}
    for index, value in engine.synthesize_batch(items):
        request_id = requests[index].id
        if isinstance(value, ItemDone):
            done[request_id] = value.error
            continue
        if isinstance(value, Words):
            continue
        got[request_id] += memoryview(value).cast("B")
        if request_id == 1 and len(got[1]) >= 4 * 160:  # request 2 hangs at its chunk 1 meanwhile
            flags[1][0] = True
    assert set(done) == {1, 3}  # the cancelled one is dropped, never ended by the engine
    assert done[1] is None and bytes(got[1]) == render_bytes("keeps going on", 8000, seconds_per_char=0.01)
    assert isinstance(done[3], EngineFailure) and str(done[3]) == "item three broke"
    assert bytes(got[3]) == render_bytes("fails here", 8000, seconds_per_char=0.01)[: 2 * 320]
    assert bytes(got[2]) == render_bytes("is cancelled", 8000, seconds_per_char=0.01)[:320]


def test_fail_raw_in_a_batch_escapes_the_generator() -> None:
    engine = _engine(max_batch=2)
    items = [
        _item(_request(1, "abc"), [False], []),
        _item(_request(2, "abcdef", fail_at=1, fail_raw=True), [False], []),
    ]
    with pytest.raises(RuntimeError, match="injected failure"):
        list(engine.synthesize_batch(items))


def test_join_batches_takes_joiners_once_per_step_each_with_its_audio_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextts_sidecar.engines import fake

    assert not _engine(max_batch=3).joins_batches
    engine = _engine(max_batch=3, join_batches=True)
    assert engine.joins_batches
    events: list[Any] = []
    monkeypatch.setattr(fake, "_sleep_unless", lambda seconds, stop: events.append("compute") or True)
    first = _request(1, "the first, six chunks", delay=0.01, record=str(tmp_path / "1.json"))
    joiners = [_request(2, "joins at two", record=str(tmp_path / "2.json")), _request(3, "at three")]
    alone = {}
    for request in (first, *joiners):
        seen: list[str] = []
        chunks = list(engine.synthesize(request, lambda _s, _f=None, m="", seen=seen: seen.append(m), lambda: False))
        alone[request.id] = (_timeline(chunks), seen)
    progress: dict[int, list[str]] = {1: [], 2: [], 3: []}
    handed = {2: [_item(joiners[0], [False], progress[2])], 3: [_item(joiners[1], [False], progress[3])]}
    steps = 0
    events.clear()  # synthesize() above slept too

    def join(room: int) -> list[BatchItem[Any]]:
        nonlocal steps
        steps += 1
        events.append(("join", room))
        return handed.pop(steps, [])

    got: dict[int, list[Any]] = {1: [], 2: [], 3: []}
    ids = [1]
    for index, value in engine.synthesize_batch([_item(first, [False], progress[1])], join):
        if index == len(ids):
            ids.append(2 if len(ids) == 1 else 3)  # a joiner's first yield: numbered on
        if not isinstance(value, ItemDone):
            got[ids[index]].append(value)
    assert ids == [1, 2, 3]
    # One join before each step's compute, with the room max_batch leaves.
    assert events[:6] == [("join", 2), "compute", ("join", 2), "compute", ("join", 1), "compute"]
    assert all(events[i] == "compute" for i in range(1, len(events), 2))
    for request_id in (1, 2, 3):
        assert (_timeline(got[request_id]), progress[request_id]) == alone[request_id]
    # Who shared a step with whom: 2 (six chunks) was still in the batch when 3 joined.
    assert msgspec.json.decode((tmp_path / "1.json").read_bytes())["batch"] == [1, 2, 3]
    second = msgspec.json.decode((tmp_path / "2.json").read_bytes())
    assert second["batch"] == [1, 2, 3] and second["joined"] == 1  # after the batch's first step
    assert "joined" not in msgspec.json.decode((tmp_path / "1.json").read_bytes())

"""The adapter's synthesize(): streams, bit-exact audio, upstream keywords (engines/indextts/_adapter.py).

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from indextts_support import ignore_progress, infer_calls, loaded_engine, make_engine, make_request, never, speak

from indextts_sidecar.engines import Cancelled, EngineError, RequestError
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, IndexTTSAuto
from indextts_sidecar.engines.indextts._segments import SegmentTexts, pieces_text
from indextts_sidecar.protocol import Emotion, EmotionAudio, EmotionText, EmotionVector
from indextts_sidecar.protocol.segments import read_segment

# ----------------------------------------------------------------- synthesize


def test_streams_segments_with_silence_between_them_only(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    events: list[tuple[Any, ...]] = []
    request = make_request(
        IndexTTS2Engine, voice, text="a b c d e", max_text_tokens_per_segment=2, interval_silence=100
    )
    chunks = [bytes(c) for c in engine.synthesize(request, lambda *a: events.append(a), never)]
    sizes = [len(c) // 2 for c in chunks]
    # 0.1 s per word; upstream's 100 ms silence after the last segment is dropped.
    assert sizes == [4410, 2205, 4410, 2205, 2205]
    assert chunks[1] == chunks[3] == bytes(4410)
    assert all(np.frombuffer(chunks[i], dtype="<i2").any() for i in (0, 2, 4))
    (infer,) = infer_calls(calls())
    assert infer["kwargs"]["stream_return"] is True and infer["kwargs"]["output_path"] is None
    assert [e["index"] for e in calls() if e["event"] == "segment"] == [1, 2, 3]
    messages = [e[2] for e in events if e[0] == "synthesize"]
    assert [m for m in messages if m.startswith("segment")] == [
        "segment 1 ready (0.20 s of audio)",
        "segment 2 ready (0.50 s of audio)",
        "segment 3 ready (0.70 s of audio)",
    ]
    # Reference processing (upstream's first next()) is a stage of its own, before any audio.
    stages = [e[0] for e in events]
    first_ready = next(i for i, e in enumerate(events) if "ready (" in e[2])
    assert "prepare" in stages[:first_ready] and "prepare" not in stages[first_ready:]
    assert events[-1] == ("synthesize", 1.0, "3 segments, 0.70 s of audio")


def test_interval_silence_0_streams_the_segments_only(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    # Upstream yields its list of segments where the silence belongs: never audio.
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    events: list[tuple[Any, ...]] = []
    request = make_request(IndexTTS2Engine, voice, text="a b c d e", max_text_tokens_per_segment=2, interval_silence=0)
    chunks = list(engine.synthesize(request, lambda *a: events.append(a), never))
    assert [len(bytes(c)) // 2 for c in chunks] == [4410, 4410, 2205]
    assert all(np.frombuffer(bytes(c), dtype="<i2").any() for c in chunks)
    assert [e[2] for e in events if "ready (" in e[2]] == [
        "segment 1 ready (0.20 s of audio)",
        "segment 2 ready (0.40 s of audio)",
        "segment 3 ready (0.50 s of audio)",
    ]
    (finished,) = [e for e in calls() if e["event"] == "finished"]
    assert finished["produced"] == 3


@pytest.mark.parametrize(
    ("flavour", "said"),
    [
        ("v2", ["A B", "C D", "E"]),  # IndexTTS-2's tokenizer upper-cases (the stand-in's does too)
        ("pypi", ["A B", "C D", "E"]),
        ("v25", ["a b", "c d", "e"]),  # 2.5's segmenter returns its normalised text as it is
    ],
)
def test_each_segment_is_announced_with_the_text_upstreams_segmenter_cut(
    flavour: str, said: list[str], ckpt: Path, ckpt25: Path, voice: str, standin: Callable[[str], None]
) -> None:
    standin(flavour)
    cls = IndexTTS25Engine if flavour == "v25" else IndexTTS2Engine
    engine = loaded_engine(cls, ckpt25 if flavour == "v25" else ckpt)
    request = make_request(cls, voice, text="a b c d e", max_text_tokens_per_segment=2, interval_silence=100)
    items: list[Any] = []
    for chunk in engine.synthesize(request, lambda *a: items.append(a), never):
        items.append(len(bytes(chunk)) // 2)
    # Each segment's words, then its "ready", then its audio; a silence goes with the segment before it.
    marks = [
        i if isinstance(i, int) else i[2] for i in items if isinstance(i, int) or i[2].startswith(("text:", "segment"))
    ]
    assert marks == [
        f"text: {said[0]}",
        "segment 1 ready (0.20 s of audio)",
        4410,
        2205,
        f"text: {said[1]}",
        "segment 2 ready (0.50 s of audio)",
        4410,
        2205,
        f"text: {said[2]}",
        "segment 3 ready (0.70 s of audio)",
        2205,
    ]
    assert [read_segment(m) for m in marks if isinstance(m, str)][::2] == said
    # Every request is its own: a second one announces its own segments only.
    items.clear()
    list(
        engine.synthesize(make_request(cls, voice, text="f g", interval_silence=100), lambda *a: items.append(a), never)
    )
    assert [i[2] for i in items if i[2].startswith("text:")] == ["text: F G" if flavour != "v25" else "text: f g"]


def test_a_whole_answer_is_announced_with_every_segments_text(
    ckpt: Path, voice: str, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    monkeypatch.setenv("INDEXTTS_STANDIN_NO_STREAM", "1")  # an upstream that ignores stream_return
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    events: list[tuple[Any, ...]] = []
    request = make_request(IndexTTS2Engine, voice, text="a b c", max_text_tokens_per_segment=2)
    (chunk,) = engine.synthesize(request, lambda *a: events.append(a), never)
    assert len(bytes(chunk)) // 2 == 3 * 2205 + 4410  # three words, one silence between two segments
    assert [e[2] for e in events if e[2].startswith("text:")] == ["text: A B C"]


def test_an_upstream_without_a_known_segmenter_announces_no_text() -> None:
    texts = SegmentTexts()
    assert texts.install(object()) is False
    assert texts.text(0) is None


def test_a_segmenters_answer_passes_through_unchanged_and_its_pieces_read_as_text() -> None:
    class Tokenizer:
        def split_segments(self, tokens: list[str], limit: int, quick_streaming_tokens: int = 0) -> list[list[str]]:
            return [tokens[:limit], tokens[limit:]]

    class Model:
        tokenizer = Tokenizer()

    model = Model()
    texts = SegmentTexts()
    assert texts.install(model)
    pieces = ["\u2581HELLO", ",", "\u2581WORLD", ".", "\u2581你", "\u2581好", "\u2581", "!"]
    assert model.tokenizer.split_segments(pieces, 4, quick_streaming_tokens=0) == [pieces[:4], pieces[4:]]
    assert texts.texts == ["HELLO, WORLD.", "你好 !"]
    texts.start()
    assert texts.texts == []
    assert pieces_text(["\u2581A", "\u2581\u2581B  "]) == "A B"


@pytest.mark.parametrize("flavour", ["v2", "pypi"])
def test_audio_is_bit_exact_on_either_chunk_scale(
    flavour: str,
    ckpt: Path,
    voice: str,
    tmp_path: Path,
    standin: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every = np.arange(-32768, 32768, dtype="<i2")
    audio = tmp_path / "speech.raw"
    audio.write_bytes(every.tobytes())
    monkeypatch.setenv("INDEXTTS_STANDIN_AUDIO", str(audio))
    standin(flavour)
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    request = make_request(IndexTTS2Engine, voice, text="w " * 7, max_text_tokens_per_segment=3, interval_silence=0)
    chunks = speak(engine, request)
    assert len(chunks) == 3
    assert np.array_equal(np.concatenate(chunks), every)


def test_pcm_scale_chunks_from_a_unit_scale_flavour_are_not_blown_up(
    ckpt: Path, voice: str, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A flavour detected as [-1, 1] that streams PCM-scale floats after all is caught by the peak.
    standin("pypi")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    assert engine.flavour.unit_scale
    core = sys.modules["indextts._standin_core"]
    monkeypatch.setattr(core, "_chunk", lambda int16, unit_scale: core.FakeTensor(int16.astype(np.float32)))
    chunks = speak(engine, make_request(IndexTTS2Engine, voice, text="a b", interval_silence=0))
    assert int(np.max(np.abs(np.concatenate(chunks)))) == 12000


@pytest.mark.parametrize("interval_silence", [100, 0])
def test_the_stream_matches_the_non_streaming_tuple_sample_for_sample(
    interval_silence: int, ckpt: Path, voice: str, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    request = make_request(
        IndexTTS2Engine, voice, text="a b c", max_text_tokens_per_segment=1, interval_silence=interval_silence
    )
    streamed = np.concatenate(speak(engine, request))
    monkeypatch.setenv("INDEXTTS_STANDIN_NO_STREAM", "1")  # an upstream that ignores stream_return
    (whole,) = speak(engine, request)
    assert len(whole) == 3 * 2205 + 2 * int(22050 * interval_silence / 1000)
    assert np.array_equal(whole, streamed)


def test_errors_of_the_first_next_are_reported_as_preparing_the_references(
    ckpt: Path,
    voice: str,
    tmp_path: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    # The voice passed check() and is gone when upstream reads it, at the first next().
    gone = tmp_path / "gone.wav"
    gone.write_bytes(b"RIFF")
    request = make_request(IndexTTS2Engine, str(gone))
    engine.check(request)
    gone.unlink()
    events: list[tuple[Any, ...]] = []
    with pytest.raises(EngineError) as info:
        list(engine.synthesize(request, lambda *a: events.append(a), never))
    assert str(info.value).startswith("preparing the references failed: FileNotFoundError: ")
    assert (info.value.code, info.value.field) == ("engine_error", "$.voice")
    assert events and {e[0] for e in events} == {"prepare"}
    # Any other failure there: no field.
    monkeypatch.setenv("INDEXTTS_STANDIN_INFER_ERROR", "CUDA out of memory")
    with pytest.raises(EngineError) as info:
        speak(engine, make_request(IndexTTS2Engine, voice))
    assert str(info.value) == "preparing the references failed: RuntimeError: CUDA out of memory"
    assert (info.value.code, info.value.field) == ("engine_error", None)
    assert len(infer_calls(calls())) == 2 and not any(e["event"] == "segment" for e in calls())
    monkeypatch.delenv("INDEXTTS_STANDIN_INFER_ERROR")
    assert len(speak(engine, make_request(IndexTTS2Engine, voice))) == 1, "the model stays usable"


def test_a_failing_emotion_clip_is_named_as_such(
    ckpt: Path, voice: str, tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"RIFF clip")
    request = make_request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=str(clip)))
    engine.check(request)
    clip.unlink()  # gone by the time upstream reads it
    with pytest.raises(EngineError) as info:
        list(engine.synthesize(request, ignore_progress, never))
    assert str(info.value).startswith("preparing the references failed: FileNotFoundError: ")
    assert info.value.field == "$.emotion.path"


def test_cancel_takes_effect_between_segments(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    request = make_request(IndexTTS2Engine, voice, text="a b c d e f g h i j", max_text_tokens_per_segment=1)
    received = []

    def consume() -> None:
        # The consumer cancels as soon as it holds the first chunk.
        for chunk in engine.synthesize(request, ignore_progress, lambda: bool(received)):
            received.append(chunk)

    with pytest.raises(Cancelled):
        consume()
    assert len(received) == 1 and len(bytes(received[0])) == 2 * 2205
    entries = calls()
    assert [e["index"] for e in entries if e["event"] == "segment"] == [1]
    assert {"event": "closed", "produced": 1} in [{k: e[k] for k in ("event", "produced") if k in e} for e in entries]
    assert not any(e["event"] == "finished" for e in entries)


def test_infer_kwargs_mapping_for_indextts2(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    options = {
        "use_random": True,
        "interval_silence": 0,
        "max_text_tokens_per_segment": 80,
        "more_segment_before": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "num_beams": 1,
        "repetition_penalty": 9.5,
        "length_penalty": -0.5,
        "max_mel_tokens": 800,
    }
    # The stand-in, as upstream, raises on a generation keyword it does not pop: these all arrive.
    assert speak(engine, make_request(IndexTTS2Engine, voice, text="hello world", **options))
    assert speak(engine, make_request(IndexTTS2Engine, voice, text="plain"))
    first, second = infer_calls(calls())
    base = {"spk_audio_prompt": voice, "output_path": None, "stream_return": True}
    assert first["args"] == []
    assert first["kwargs"] == {**base, "text": "hello world", **options}
    assert second["kwargs"] == {**base, "text": "plain"}


@pytest.mark.parametrize(
    ("emotion", "options", "expected"),
    [
        (
            EmotionVector(
                happy=0.1,
                angry=0.2,
                sad=0.05,
                afraid=0.0,
                disgusted=0.0,
                melancholic=0.15,
                surprised=0.1,
                calm=0.3,
                alpha=2.0,
            ),
            {},
            # upstream's UI bias, sum 0.696875 under the 0.8 cap
            {"emo_vector": [0.09375, 0.175, 0.05, 0.0, 0.0, 0.140625, 0.06875, 0.16875], "emo_alpha": 1.0},
        ),
        (EmotionVector(calm=0.5, alpha=-1.0), {}, {"emo_vector": [0.0] * 7 + [0.28125], "emo_alpha": 0.0}),
        (
            EmotionVector(happy=1.0, angry=1.0),  # biased to 0.9375 + 0.875, then capped to a sum of 0.8
            {},
            {"emo_vector": [0.9375 * 0.8 / 1.8125, 0.875 * 0.8 / 1.8125] + [0.0] * 6, "emo_alpha": 1.0},
        ),
        (
            EmotionVector(happy=0.1, calm=0.3, alpha=0.5),
            {"normalize_emotion": False},
            {"emo_vector": [0.1] + [0.0] * 6 + [0.3], "emo_alpha": 0.5},
        ),
        (
            EmotionText(text="quietly furious", alpha=0.6),
            {},
            {"use_emo_text": True, "emo_text": "quietly furious", "emo_alpha": 0.6},
        ),
        (EmotionText(), {}, {"use_emo_text": True, "emo_text": None, "emo_alpha": 1.0}),
    ],
)
def test_emotion_mapping(
    emotion: Emotion,
    options: dict[str, Any],
    expected: dict[str, Any],
    ckpt: Path,
    voice: str,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    speak(engine, make_request(IndexTTS2Engine, voice, emotion=emotion, **options))
    (infer,) = infer_calls(calls())
    emotion_keys = {k: v for k, v in infer["kwargs"].items() if k.startswith(("emo", "use_emo"))}
    vector = emotion_keys.pop("emo_vector", None)
    expected = dict(expected)
    assert vector == pytest.approx(expected.pop("emo_vector", None), abs=1e-12)
    assert emotion_keys == expected


def test_emotion_audio_mapping(
    ckpt: Path, voice: str, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    clip = tmp_path / "angry.wav"
    clip.write_bytes(b"RIFF")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    speak(engine, make_request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=str(clip), alpha=0.4)))
    (infer,) = infer_calls(calls())
    assert infer["kwargs"]["emo_audio_prompt"] == str(clip) and infer["kwargs"]["emo_alpha"] == 0.4
    references = [(e["role"], e["path"]) for e in calls() if e["event"] == "reference"]
    assert references == [("speaker", voice), ("emotion", str(clip))]


def test_25_lang_and_duration(
    ckpt25: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    engine = loaded_engine(IndexTTS25Engine, ckpt25)
    speak(engine, make_request(IndexTTS25Engine, voice))
    speak(engine, make_request(IndexTTS25Engine, voice, lang="ZH", duration_factor=1.5, text_normalization=False))
    ja_engine = loaded_engine(IndexTTS25Engine, ckpt25, lang="ja")
    speak(ja_engine, make_request(IndexTTS25Engine, voice))
    default, explicit, engine_default = infer_calls(calls())
    assert default["module"] == "indextts.infer_v2_5"
    assert default["kwargs"]["lang"] == "en"
    assert {k: explicit["kwargs"][k] for k in ("lang", "duration_factor", "text_normalization")} == {
        "lang": "zh",
        "duration_factor": 1.5,
        "text_normalization": False,
    }
    assert engine_default["kwargs"]["lang"] == "ja"
    assert "duration_factor" not in default["kwargs"]


def test_25_streams_with_silence_between_segments_only(
    ckpt25: Path, voice: str, standin: Callable[[str], None]
) -> None:
    standin("v25")
    engine = loaded_engine(IndexTTS25Engine, ckpt25)
    request = make_request(IndexTTS25Engine, voice, text="a b c", max_text_tokens_per_segment=1, interval_silence=50)
    assert [len(c) for c in speak(engine, request)] == [2205, 1102, 2205, 1102, 2205]


def test_more_segment_before_is_refused_on_25(
    ckpt25: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    # Upstream 2.5 passes it on as quick_streaming_tokens, which it never reads.
    standin("v25")
    for cls in (IndexTTS25Engine, IndexTTSAuto):
        engine = make_engine(cls, model_dir=str(ckpt25))
        request = make_request(cls, voice, more_segment_before=2)
        with pytest.raises(RequestError) as info:
            engine.check(request)  # known before the load: the directory is 2.5
        assert (info.value.code, info.value.field) == ("unknown_option", "$.options.more_segment_before")
        engine.load(ignore_progress, never)
        with pytest.raises(RequestError):
            list(engine.synthesize(request, ignore_progress, never))
    assert infer_calls(calls()) == []


def test_flavour_specific_options_are_rejected_after_load(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("pypi")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    with pytest.raises(RequestError) as info:
        engine.check(make_request(IndexTTS2Engine, voice, more_segment_before=1))
    assert (info.value.code, info.value.field) == ("unknown_option", "$.options.more_segment_before")
    speak(engine, make_request(IndexTTS2Engine, voice, quick_streaming_tokens=5))
    (infer,) = infer_calls(calls())
    assert infer["kwargs"]["quick_streaming_tokens"] == 5 and "more_segment_before" not in infer["kwargs"]


def test_auto_on_a_2_directory_refuses_25_options(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")  # the code of both versions is installed: the directory decides
    engine = make_engine(IndexTTSAuto, model_dir=str(ckpt))
    for name, value in (("duration_factor", 0.8), ("lang", "en"), ("text_normalization", False)):
        request = make_request(IndexTTSAuto, voice, **{name: value})
        with pytest.raises(RequestError) as info:
            engine.check(request)  # known before the load, from the directory
        assert (info.value.code, info.value.field) == ("unknown_option", f"$.options.{name}")
        assert "this checkpoint is IndexTTS-2" in str(info.value)
    engine.load(ignore_progress, never)
    assert engine.flavour.kind == "2"
    with pytest.raises(RequestError) as info:
        list(engine.synthesize(make_request(IndexTTSAuto, voice, duration_factor=0.8), ignore_progress, never))
    assert info.value.field == "$.options.duration_factor"
    assert infer_calls(calls()) == []
    speak(engine, make_request(IndexTTSAuto, voice))
    (infer,) = infer_calls(calls())
    assert "lang" not in infer["kwargs"] and infer["module"] == "indextts.infer_v2"


def test_emotion_text_on_25_without_qwen_never_reaches_upstream(
    ckpt25: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    engine = loaded_engine(IndexTTSAuto, ckpt25)  # resolves to 2.5, whose default is use_qwen_emo=False
    assert engine.flavour.kind == "2.5"
    request = make_request(IndexTTSAuto, voice, emotion=EmotionText(text="happy"))
    with pytest.raises(RequestError, match="use_qwen_emo=true") as info:
        engine.check(request)
    assert info.value.field == "$.emotion"
    with pytest.raises(RequestError):
        list(engine.synthesize(request, ignore_progress, never))
    assert infer_calls(calls()) == []
    with_qwen = loaded_engine(IndexTTS25Engine, ckpt25, use_qwen_emo=True)
    speak(with_qwen, make_request(IndexTTS25Engine, voice, emotion=EmotionText(text="happy")))
    assert infer_calls(calls())[-1]["kwargs"]["use_emo_text"] is True


def test_sampling_options_the_accelerated_gpt_ignores_are_refused(
    ckpt: Path,
    voice: str,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INDEXTTS_STANDIN_CUDA", "1")  # upstream builds its accel engine on CUDA only
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt, use_accel=True)
    for name, value in (("top_p", 0.5), ("top_k", 5), ("num_beams", 2), ("repetition_penalty", 2.0)):
        with pytest.raises(RequestError) as info:
            engine.check(make_request(IndexTTS2Engine, voice, **{name: value}))
        assert (info.value.code, info.value.field) == ("unknown_option", f"$.options.{name}")
    speak(engine, make_request(IndexTTS2Engine, voice, temperature=0.5, max_mel_tokens=100))
    (infer,) = infer_calls(calls())
    assert (infer["kwargs"]["temperature"], infer["kwargs"]["max_mel_tokens"]) == (0.5, 100)
    # Without CUDA there is no accel engine, and every option counts.
    monkeypatch.delenv("INDEXTTS_STANDIN_CUDA")
    loaded_engine(IndexTTS2Engine, ckpt, use_accel=True).check(make_request(IndexTTS2Engine, voice, top_p=0.5))

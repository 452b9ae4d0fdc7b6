"""validate_synthesis: a request checked and resolved without a process, a stream or a thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from indextts_sidecar._paths import PathPolicy
from indextts_sidecar._validate import UPLOADS_ONLY, RequestLimits, validate_synthesis
from indextts_sidecar.engines import EngineError
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions
from indextts_sidecar.protocol import (
    EMOTION_CAPABILITIES,
    Emotion,
    EmotionAudio,
    EmotionText,
    EmotionVector,
    Synthesize,
)

ENGINE = FakeEngine(FakeOptions())
DEFAULT_LIMITS = RequestLimits()


def _error(message: Synthesize, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[str, object, str]:
    with pytest.raises(EngineError) as caught:
        validate_synthesis(ENGINE, message, limits)
    return caught.value.code, caught.value.field, str(caught.value)


def test_a_valid_request_comes_out_with_its_options_decoded(voice: str) -> None:
    emotion = EmotionVector(happy=0.5)
    message = Synthesize(id=9, text="hi", voice=voice, emotion=emotion, sample_rate=8000, options={"seconds": 0.25})
    request = validate_synthesis(ENGINE, message, RequestLimits())
    assert (request.id, request.text, request.voice, request.emotion) == (9, "hi", voice, emotion)
    assert request.sample_rate == 8000 and request.options.seconds == 0.25


def test_options_are_checked_against_the_engines_own() -> None:
    assert _error(Synthesize(id=1, text="x", options={"nope": 1}))[:2] == ("unknown_option", "$.options.nope")
    code, field, _ = _error(Synthesize(id=1, text="x", options={"seconds": -1}))
    assert (code, field) == ("invalid_option", "$.options.seconds")


def test_text_and_rate_limits() -> None:
    code, field, text = _error(Synthesize(id=1, text="abcd"), RequestLimits(max_text=3))
    assert (code, field) == ("invalid_input", "$.text") and "limit of 3" in text
    assert _error(Synthesize(id=1, text="x", sample_rate=999))[:2] == ("invalid_option", "$.sample_rate")
    assert _error(Synthesize(id=1, text="x", sample_rate=384001))[:2] == ("invalid_option", "$.sample_rate")
    assert validate_synthesis(ENGINE, Synthesize(id=1, text="abc"), RequestLimits(max_text=3)).text == "abc"


def test_paths_outside_the_voice_dirs_are_refused(tmp_path: Path) -> None:
    inside, outside = tmp_path / "voices", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.wav").write_bytes(b"RIFF")
    (outside / "b.wav").write_bytes(b"RIFF")
    limits = RequestLimits(paths=PathPolicy([str(inside)]))
    assert validate_synthesis(ENGINE, Synthesize(id=1, text="x", voice=str(inside / "a.wav")), limits).voice
    code, field, text = _error(Synthesize(id=1, text="x", voice=str(outside / "b.wav")), limits)
    assert (code, field) == ("invalid_input", "$.voice") and "outside the allowed directories" in text
    emotion = EmotionAudio(path=str(outside / "b.wav"))
    assert _error(Synthesize(id=1, text="x", emotion=emotion), limits)[:2] == ("invalid_input", "$.emotion.path")


def test_uploads_only_refuses_every_path_and_registered_needs_a_store(voice: str) -> None:
    uploads = RequestLimits(path_voices=False)
    assert _error(Synthesize(id=1, text="x", voice=voice), uploads) == ("invalid_input", "$.voice", UPLOADS_ONLY)
    emotion = EmotionAudio(path=voice)
    assert _error(Synthesize(id=1, text="x", emotion=emotion), uploads)[:2] == ("invalid_input", "$.emotion.path")
    code, field, text = _error(Synthesize(id=1, text="x", voice="registered:alice"))
    assert (code, field) == ("invalid_input", "$.voice") and "no --voice-dir" in text


def test_the_engines_own_check_runs_last() -> None:
    # An engine that reads no paths: the policy lets the name through, the engine's check() refuses it.
    engine = FakeEngine(FakeOptions(validate=False))
    with pytest.raises(EngineError) as caught:
        validate_synthesis(engine, Synthesize(id=1, text="x", voice="missing:alice"), RequestLimits())
    assert (caught.value.code, caught.value.field) == ("invalid_input", "$.voice")
    assert str(caught.value) == "voice 'missing:alice' does not exist"


@pytest.mark.parametrize(
    ("emotion", "what"),
    [
        (EmotionVector(happy=0.5), "emotion weights"),
        (EmotionAudio(path="/nowhere.wav"), "emotion from a reference clip"),
        (EmotionText(text="calm"), "emotion from a description"),
    ],
)
def test_an_emotion_the_engine_cannot_apply_is_refused(emotion: Emotion, what: str) -> None:
    # The capability each kind needs comes from protocol.EMOTION_CAPABILITIES, the table the
    # serving core reads too; this engine declares none of them.
    class NoEmotion(FakeEngine):
        capabilities = ("streaming",)

    with pytest.raises(EngineError) as caught:
        validate_synthesis(NoEmotion(FakeOptions()), Synthesize(id=1, text="x", emotion=emotion), DEFAULT_LIMITS)
    assert (caught.value.code, caught.value.field) == ("unsupported", "$.emotion")
    assert str(caught.value) == f"engine 'fake' has no {what}"
    assert set(EMOTION_CAPABILITIES) == {EmotionVector, EmotionAudio, EmotionText}

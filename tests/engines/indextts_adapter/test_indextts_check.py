"""The adapter's check(): everything refused before a request is queued (engines/indextts/_adapter.py).

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from indextts_support import make_engine, make_request

from indextts_sidecar.engines import RequestError, SynthesisRequest
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, IndexTTSAuto
from indextts_sidecar.protocol import Emotion, EmotionAudio, EmotionText, EmotionVector

# ----------------------------------------------------------------- check()


def _check_error(engine: Any, request: SynthesisRequest[Any]) -> str:
    with pytest.raises(RequestError) as info:
        engine.check(request)
    assert info.value.code == "invalid_input"
    return str(info.value.field)


def test_check_rejects_bad_text_and_voice(tmp_path: Path, voice: str) -> None:
    engine = make_engine(IndexTTS2Engine)
    cls = IndexTTS2Engine
    assert _check_error(engine, make_request(cls, voice, text=" \n ")) == "$.text"
    # Nothing to speak: upstream 2.5 would voice the language tag alone.
    for text in ("...", "?! ,", "\u3002\uff01"):
        assert _check_error(engine, make_request(cls, voice, text=text)) == "$.text"
    engine.check(make_request(cls, voice, text="1."))
    engine.check(make_request(cls, voice, text="\u4f60\u597d\u3002"))
    assert _check_error(engine, make_request(cls, None)) == "$.voice"
    assert _check_error(engine, make_request(cls, "")) == "$.voice"
    assert _check_error(engine, make_request(cls, str(tmp_path / "nope.wav"))) == "$.voice"
    assert _check_error(engine, make_request(cls, str(tmp_path))) == "$.voice"
    engine.check(make_request(cls, voice))


def test_check_rejects_an_unreadable_voice(voice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Permission bits cannot make a file unreadable for root (CI runs as root): ask os.access.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != voice and real_access(path, mode))
    assert _check_error(make_engine(IndexTTS2Engine), make_request(IndexTTS2Engine, voice)) == "$.voice"


@pytest.mark.parametrize(
    ("emotion", "field"),
    [
        (EmotionVector(happy=1.5), "$.emotion.happy"),
        (EmotionVector(sad=-0.1), "$.emotion.sad"),
        (EmotionVector(calm=float("nan")), "$.emotion.calm"),
        (EmotionVector(happy=0.2, alpha=float("inf")), "$.emotion.alpha"),
        (EmotionAudio(path="/nonexistent/emotion.wav"), "$.emotion.path"),
        (EmotionText(text="joy", alpha=float("nan")), "$.emotion.alpha"),
    ],
)
def test_check_rejects_bad_emotions(emotion: Emotion, field: str, voice: str) -> None:
    engine = make_engine(IndexTTS2Engine)
    assert _check_error(engine, make_request(IndexTTS2Engine, voice, emotion=emotion)) == field


@pytest.mark.parametrize("alpha", [-0.1, 1.01])
def test_emotion_audio_alpha_must_be_in_range(alpha: float, voice: str) -> None:
    request = make_request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=voice, alpha=alpha))
    assert _check_error(make_engine(IndexTTS2Engine), request) == "$.emotion.alpha"


def test_check_accepts_good_emotions(voice: str) -> None:
    engine = make_engine(IndexTTS2Engine)
    for emotion in (
        EmotionVector(happy=0.3, sad=0.3, calm=0.4),  # sums to exactly 1
        EmotionVector(surprised=1.0, alpha=3.0),  # alpha is clamped, as upstream does
        EmotionVector(),
        EmotionAudio(path=voice, alpha=0.0),
        EmotionText(text=None),
    ):
        engine.check(make_request(IndexTTS2Engine, voice, emotion=emotion))


def test_an_emotion_sum_over_1_needs_normalisation(voice: str) -> None:
    over = EmotionVector(happy=0.6, angry=0.5)
    make_engine(IndexTTS2Engine).check(make_request(IndexTTS2Engine, voice, emotion=over))  # normalised by default
    strict = make_request(IndexTTS2Engine, voice, emotion=over, normalize_emotion=False)
    assert _check_error(make_engine(IndexTTS2Engine), strict) == "$.emotion"
    off = make_engine(IndexTTS2Engine, normalize_emotion=False)
    assert _check_error(off, make_request(IndexTTS2Engine, voice, emotion=over)) == "$.emotion"
    off.check(make_request(IndexTTS2Engine, voice, emotion=over, normalize_emotion=True))
    # The range of each weight is checked either way.
    assert _check_error(
        make_engine(IndexTTS2Engine), make_request(IndexTTS2Engine, voice, emotion=EmotionVector(sad=1.5))
    )


def test_emotion_text_needs_the_qwen_model(voice: str) -> None:
    text = EmotionText(text="furious")
    # 2.5 runs without Qwen by default: refused before upstream's RuntimeError.
    assert (
        _check_error(make_engine(IndexTTS25Engine), make_request(IndexTTS25Engine, voice, emotion=text)) == "$.emotion"
    )
    make_engine(IndexTTS25Engine, use_qwen_emo=True).check(make_request(IndexTTS25Engine, voice, emotion=text))
    make_engine(IndexTTS2Engine).check(make_request(IndexTTS2Engine, voice, emotion=text))
    off = make_engine(IndexTTS2Engine, use_qwen_emo=False)
    assert _check_error(off, make_request(IndexTTS2Engine, voice, emotion=text)) == "$.emotion"
    # Auto does not know its flavour before loading: the check waits for the load.
    make_engine(IndexTTSAuto).check(make_request(IndexTTSAuto, voice, emotion=text))
    off_auto = make_engine(IndexTTSAuto, use_qwen_emo=False)
    assert _check_error(off_auto, make_request(IndexTTSAuto, voice, emotion=text)) == "$.emotion"

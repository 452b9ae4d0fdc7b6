"""Voice conditionings kept across requests (engines/indextts/_voice_cache.py).

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from indextts_support import loaded_engine, make_request, speak

from indextts_sidecar.engines.indextts import IndexTTS2Engine
from indextts_sidecar.protocol import EmotionAudio

# ----------------------------------------------------------------- voice conditioning cache


def _references(calls: Callable[[], list[dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(e["role"], os.path.basename(e["path"])) for e in calls() if e["event"] == "reference"]


def test_recent_voices_are_not_reprocessed(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    a.write_bytes(b"RIFF voice a")
    b.write_bytes(b"RIFF voice b")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    for path in (a, b, a, b):
        assert speak(engine, make_request(IndexTTS2Engine, str(path)))
    # Upstream's one slot alone would reprocess on every switch; restored from the cache instead.
    assert _references(calls) == [
        ("speaker", "a.wav"),
        ("emotion", "a.wav"),
        ("speaker", "b.wav"),
        ("emotion", "b.wav"),
    ]
    segments = [e for e in calls() if e["event"] == "segment"]
    digests = {path: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for path in (a, b)}
    assert [(s["speaker"], s["emotion"]) for s in segments] == [(digests[p], digests[p]) for p in (a, b, a, b)]
    assert engine.info()["voice_cache"] == {"size": 4, "entries": 2, "hits": 2, "misses": 2}


def test_an_overwritten_voice_is_reprocessed(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    voice = tmp_path / "voice.wav"
    voice.write_bytes(b"RIFF first take")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    speak(engine, make_request(IndexTTS2Engine, str(voice)))
    voice.write_bytes(b"RIFF second take, longer")  # same path: upstream's slot would reuse the first take
    speak(engine, make_request(IndexTTS2Engine, str(voice)))
    first, second = [e["speaker"] for e in calls() if e["event"] == "segment"]
    assert second == hashlib.sha256(voice.read_bytes()).hexdigest()[:16] != first
    assert _references(calls) == [("speaker", "voice.wav"), ("emotion", "voice.wav")] * 2


def test_voice_cache_0_keeps_no_conditionings(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    a.write_bytes(b"RIFF voice a")
    b.write_bytes(b"RIFF voice b")
    engine = loaded_engine(IndexTTS2Engine, ckpt, voice_cache=0)
    for path in (a, b, a):
        speak(engine, make_request(IndexTTS2Engine, str(path)))
    assert [r for r in _references(calls) if r[0] == "speaker"] == [("speaker", n) for n in ("a.wav", "b.wav", "a.wav")]
    assert engine.info()["voice_cache"]["entries"] == 0


def test_voice_cache_0_still_reuses_upstreams_slot_for_a_repeated_voice(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt, voice_cache=0)
    for _ in range(2):
        speak(engine, make_request(IndexTTS2Engine, voice))
    assert _references(calls) == [("speaker", "speaker.wav"), ("emotion", "speaker.wav")]


def test_a_cached_voice_with_another_emotion_clip(
    ckpt: Path, voice: str, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    clip = tmp_path / "angry.wav"
    clip.write_bytes(b"RIFF angry")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    speak(engine, make_request(IndexTTS2Engine, voice))
    speak(engine, make_request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=str(clip))))
    speak(engine, make_request(IndexTTS2Engine, voice))
    segments = [e for e in calls() if e["event"] == "segment"]
    own = hashlib.sha256(Path(voice).read_bytes()).hexdigest()[:16]
    angry = hashlib.sha256(clip.read_bytes()).hexdigest()[:16]
    assert [(s["speaker"], s["emotion"]) for s in segments] == [(own, own), (own, angry), (own, own)]

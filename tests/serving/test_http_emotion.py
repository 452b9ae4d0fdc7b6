"""Emotion over HTTP through the official ``openai`` package: ``instructions`` and the
``extra_body`` fields (``emotion``, ``emotion_reference``, ``emotion_strength``, ``options``)
reach the engine as the protocol's emotion.  The fake engine writes what it received to the
file its ``record`` option names, so each test checks the mapping exactly."""

from __future__ import annotations

import json
import os
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from http_support import AUTH, KEY, TIMEOUT, Server, server  # noqa: E402

from indextts_sidecar.engines.fake import render, render_bytes  # noqa: E402
from indextts_sidecar.protocol import EMOTION_NAMES  # noqa: E402

ZERO = dict.fromkeys(EMOTION_NAMES, 0.0)


@pytest.fixture(scope="module")
def voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def running(voice_dir: Path) -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY, "--voice-dir", str(voice_dir)) as s:
        yield s


@pytest.fixture
def client(running: Server) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{running.base}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0) as c:
        yield c


def _say(client: Any, record: Path, **kwargs: Any) -> bytes:
    """pcm of "abcd" with ``kwargs``; the engine records what it received into ``record``."""
    extra = dict(kwargs.pop("extra_body", {}))
    extra["options"] = {**extra.get("options", {}), "record": str(record)}
    answer = client.audio.speech.create(
        model="indextts", voice="alloy", input="abcd", response_format="pcm", extra_body=extra, **kwargs
    )
    return bytes(answer.content)


def _received(record: Path) -> dict[str, Any]:
    received: dict[str, Any] = json.loads(record.read_bytes())
    return received


def test_instructions_are_emotion_from_text(client: Any, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    pcm = _say(client, record, instructions="Speak cheerfully, a little excited.")
    assert pcm == render_bytes("abcd")
    received = _received(record)
    assert received["emotion"] == {"kind": "text", "text": "Speak cheerfully, a little excited.", "alpha": 1.0}
    assert (received["text"], received["voice"]) == ("abcd", None)


def test_instructions_with_a_strength(client: Any, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    _say(client, record, instructions="sad", extra_body={"emotion_strength": 0.25})
    assert _received(record)["emotion"] == {"kind": "text", "text": "sad", "alpha": 0.25}


def test_an_emotion_vector_by_name(client: Any, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    _say(client, record, extra_body={"emotion": {"happy": 0.6, "calm": 0.2}, "emotion_strength": 0.5})
    assert _received(record)["emotion"] == {"kind": "vector", **ZERO, "happy": 0.6, "calm": 0.2, "alpha": 0.5}


def test_no_emotion_is_none(client: Any, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    _say(client, record)
    assert _received(record)["emotion"] is None


def test_options_reach_the_engine_validated(client: Any, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    pcm = _say(client, record, extra_body={"options": {"seconds_per_char": 0.03, "chunk_seconds": 0.01}})
    options = _received(record)["options"]
    assert (options["seconds_per_char"], options["chunk_seconds"]) == (0.03, 0.01)
    assert pcm == render_bytes("abcd", seconds_per_char=0.03)


def test_an_emotion_reference_is_an_uploaded_voice(
    running: Server, client: Any, voice_dir: Path, tmp_path: Path
) -> None:
    clip = tmp_path / "angry.wav"
    with wave.open(str(clip), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(render("grr", 16000).tobytes())
    uploaded = httpx.post(
        f"{running.base}/v1/audio/voices",
        headers=AUTH,
        data={"name": "angry-ref"},
        files={"audio_sample": ("angry.wav", clip.read_bytes(), "audio/wav")},
        timeout=TIMEOUT,
    )
    assert uploaded.status_code == 200, uploaded.text
    voice_id = uploaded.json()["id"]
    for reference in (voice_id, "angry-ref"):
        record = tmp_path / f"received-{reference}.json"
        _say(client, record, extra_body={"emotion_reference": reference, "emotion_strength": 0.8})
        emotion = _received(record)["emotion"]
        assert set(emotion) == {"kind", "path", "alpha"} and (emotion["kind"], emotion["alpha"]) == ("audio", 0.8)
        path = emotion["path"]
        assert os.path.dirname(os.path.realpath(path)).startswith(os.path.realpath(voice_dir)), path
        assert os.path.isfile(path)


BAD = [
    ({"instructions": "happy", "emotion": {"happy": 0.5}}, "emotion"),
    ({"emotion": {"joyful": 0.5}}, "emotion"),
    ({"emotion": {"happy": 1.5}}, "emotion.happy"),
    ({"emotion": {"happy": -0.1}}, "emotion.happy"),
    ({"emotion": {"happy": "lots"}}, "emotion"),
    ({"emotion": {"happy": 0.7, "sad": 0.6}}, "emotion"),  # the engine's rule: the sum is at most 1
    ({"emotion": {"happy": 0.5}, "emotion_strength": 1.5}, "emotion_strength"),
    ({"emotion_strength": 0.5}, "emotion_strength"),
    ({"emotion_reference": "nobody"}, "emotion_reference"),
    ({"emotion_reference": "alloy"}, "emotion_reference"),
    ({"emotion_reference": "/etc/passwd"}, "emotion_reference"),
    ({"instructions": "  "}, "instructions"),
    ({"instructions": "x" * 4097}, "instructions"),  # past --max-input, like the input
    ({"options": {"temperature": 0.7}}, "options.temperature"),
    ({"options": {"seconds_per_char": 99}}, "options.seconds_per_char"),
]


@pytest.mark.parametrize(("body", "param"), BAD)
def test_bad_emotion_fields_are_400s_naming_the_field(
    running: Server, voice_dir: Path, body: dict[str, Any], param: str
) -> None:
    answer = httpx.post(
        f"{running.base}/v1/audio/speech",
        headers=AUTH,
        json={"model": "indextts", "input": "abcd", "response_format": "pcm", **body},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    # Nothing of the server's in the answer: no path of its voice directory, no traceback.
    assert os.path.realpath(voice_dir) not in error["message"] and "Traceback" not in error["message"]


def test_an_engine_without_emotion_refuses_each_kind_saying_why(tmp_path: Path) -> None:
    with (
        server("--engine", "espeak") as s,
        openai.OpenAI(base_url=f"{s.base}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0) as client,
    ):
        for kwargs, param, what in (
            ({"instructions": "cheerful"}, "instructions", "emotion from a description"),
            ({"extra_body": {"emotion": {"happy": 0.5}}}, "emotion", "emotion weights"),
            ({"extra_body": {"emotion_reference": "x"}}, "emotion_reference", "emotion from a reference clip"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.audio.speech.create(model="indextts", voice="alloy", input="hi", **kwargs)
            error = caught.value.body
            assert caught.value.status_code == 400
            assert error["param"] == param and error["code"] == "unsupported", error
            assert error["message"] == f"engine 'espeak' has no {what} ({param})"
        plain = client.audio.speech.create(model="indextts", voice="alloy", input="hi", response_format="wav")
        assert plain.content[:4] == b"RIFF"

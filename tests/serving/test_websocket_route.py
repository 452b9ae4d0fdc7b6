"""``/v1/audio/speech/stream``'s emotion fields and metrics, driven by the ``websockets`` client
against a real ``serve`` process on the fake engine.

The fake engine writes what it received to the file its ``record`` option names, so the
mapping from a context's settings to the protocol's emotion is checked exactly; ``/metrics``
is read with prometheus_client's own parser.  asyncio only: ``websockets``' client and the
server (uvicorn) are asyncio libraries.
"""

from __future__ import annotations

import json
import os
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import AUTH, KEY, TIMEOUT, Server, server
from websockets.asyncio.client import connect
from ws_support import WAIT, Socket, session

from indextts_sidecar.engines.fake import render, render_bytes
from indextts_sidecar.protocol import EMOTION_NAMES

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

ZERO = dict.fromkeys(EMOTION_NAMES, 0.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def srv(voice_dir: Path) -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY, "--voice-dir", str(voice_dir)) as running:
        yield running


async def speak(s: Server, record: Path, text: str = "Hello there.", **settings: Any) -> list[Any]:
    """One context with ``settings`` speaks ``text``; the engine records what it received."""
    options = {**settings.pop("options", {}), "record": str(record)}
    async with session(s) as ws:
        await ws.send("context.config", context_id="c", options=options, **settings)
        await ws.send("input.text", context_id="c", text=text)
        await ws.send("input.done", context_id="c")
        return await ws.until_done("c")


def audio_of(messages: list[Any]) -> bytes:
    return b"".join(m[1] for m in messages if isinstance(m, tuple))


def received(record: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(record.read_bytes())
    return result


# ------------------------------------------------------------------ emotion


async def test_instructions_become_emotion_from_text(srv: Server, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    messages = await speak(srv, record, instructions="Speak cheerfully.", emotion_strength=0.25)
    assert messages[-1] == {"type": "context.done", "context_id": "c"}
    assert audio_of(messages) == render_bytes("Hello there.")
    got = received(record)
    assert got["emotion"] == {"kind": "text", "text": "Speak cheerfully.", "alpha": 0.25}
    assert (got["text"], got["voice"]) == ("Hello there.", None)


async def test_an_emotion_vector_by_name(srv: Server, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    await speak(srv, record, emotion={"happy": 0.6, "calm": 0.2})
    assert received(record)["emotion"] == {"kind": "vector", **ZERO, "happy": 0.6, "calm": 0.2, "alpha": 1.0}


async def test_the_session_gives_emotion_to_contexts_opened_later(srv: Server, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    async with session(srv) as ws:
        await ws.send("session.config", emotion={"sad": 0.5}, emotion_strength=0.75)
        await ws.send("input.text", context_id="later", text="Rain again.")
        await ws.send("context.config", context_id="x", options={"record": str(record)})
        await ws.send("input.text", context_id="x", text="Rain again.")
        await ws.send("input.done", context_id="x")
        messages = await ws.until_done("x")
    assert messages[-1] == {"type": "context.done", "context_id": "x"}
    assert received(record)["emotion"] == {"kind": "vector", **ZERO, "sad": 0.5, "alpha": 0.75}


async def test_an_emotion_reference_is_an_uploaded_voice(srv: Server, voice_dir: Path, tmp_path: Path) -> None:
    clip = tmp_path / "angry.wav"
    with wave.open(str(clip), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(render("grr", 16000).tobytes())
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        uploaded = await http.post(
            f"{srv.base}/v1/audio/voices",
            headers=AUTH,
            data={"name": "ws-angry"},
            files={"audio_sample": ("angry.wav", clip.read_bytes(), "audio/wav")},
        )
    assert uploaded.status_code == 200, uploaded.text
    record = tmp_path / "received.json"
    messages = await speak(srv, record, emotion_reference=uploaded.json()["id"], emotion_strength=0.8)
    assert messages[-1]["type"] == "context.done"
    emotion = received(record)["emotion"]
    assert set(emotion) == {"kind", "path", "alpha"} and (emotion["kind"], emotion["alpha"]) == ("audio", 0.8)
    assert os.path.dirname(os.path.realpath(emotion["path"])).startswith(os.path.realpath(voice_dir))


@pytest.mark.parametrize(
    ("settings", "code", "words"),
    [
        ({"instructions": "calm", "emotion": {"calm": 0.5}}, "invalid_request_error", "give one of"),
        ({"emotion_strength": 0.5}, "invalid_request_error", "emotion_strength needs"),
        ({"emotion": {"gleeful": 0.5}}, "invalid_request_error", "unknown emotion 'gleeful'"),
        ({"emotion": {"happy": 1.5}}, "invalid_request_error", "emotion.happy must be in [0, 1]"),
        ({"emotion_reference": "no-such-voice"}, "unknown_voice", "emotion_reference voice"),
        ({"instructions": "x" * 4097}, "input_too_long", "at most 4096"),
    ],
)
async def test_refused_emotion_is_an_error_event_and_the_connection_goes_on(
    srv: Server, tmp_path: Path, settings: dict[str, Any], code: str, words: str
) -> None:
    record = tmp_path / "received.json"
    async with session(srv) as ws:
        await ws.send("context.config", context_id="bad", **settings)
        refusal = await ws.next()
        assert isinstance(refusal, dict)
        assert (refusal["type"], refusal["code"], refusal["context_id"]) == ("error", code, "bad")
        assert words in refusal["message"]
        await ws.send("context.config", context_id="good", options={"record": str(record)})
        await ws.send("input.text", context_id="good", text="Still here.")
        await ws.send("input.done", context_id="good")
        messages = await ws.until_done("good")
    assert messages[-1] == {"type": "context.done", "context_id": "good"}
    assert received(record)["emotion"] is None  # the refused context reached no engine


async def test_the_engine_validates_options_as_on_the_socket(srv: Server, tmp_path: Path) -> None:
    record = tmp_path / "received.json"
    messages = await speak(srv, record, options={"seconds_per_char": 0.03, "chunk_seconds": 0.01})
    assert audio_of(messages) == render_bytes("Hello there.", seconds_per_char=0.03)
    options = received(record)["options"]
    assert (options["seconds_per_char"], options["chunk_seconds"]) == (0.03, 0.01)
    unknown = await speak(srv, tmp_path / "unused.json", options={"no_such_option": 1})
    error = unknown[-1]
    assert (error["type"], error["code"], error["context_id"]) == ("error", "unknown_option", "c")
    assert "no_such_option" in error["message"]


# ------------------------------------------------------------------ metrics


def _families(s: Server) -> dict[str, Any]:
    from prometheus_client import parser

    text = httpx.get(s.base + "/metrics", timeout=TIMEOUT).text
    return {family.name: family for family in parser.text_string_to_metric_families(text)}


def _counts(family: Any, suffix: str = "_count") -> dict[tuple[tuple[str, str], ...], float]:
    """Each label set's ``_count`` (or the sample named with ``suffix``)."""
    return {
        tuple(sorted(sample.labels.items())): sample.value for sample in family.samples if sample.name.endswith(suffix)
    }


def _sums(family: Any) -> float:
    return sum(_counts(family, "_sum").values())


async def test_each_sentence_is_counted_as_a_request_per_engine_and_member(tmp_path: Path) -> None:
    clip = tmp_path / "alice.wav"
    clip.write_bytes(b"RIFF stand-in clip")
    # Five characters a sentence, 0.3 s of audio in chunks of 0.1 s: three chunks, two gaps.
    chunked = {"chunk_seconds": 0.1}
    with server("--engine", "fake", "--size", "2", f"--voice=alice={clip}") as s:
        url = s.base.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with connect(url, open_timeout=WAIT) as raw:
            ws = Socket(raw)
            assert (await ws.next())["type"] == "session.ready"
            await ws.send("context.config", context_id="a", voice="alice", options=chunked)
            await ws.send("context.config", context_id="b", voice="alloy", options=chunked)
            await ws.send("input.text", context_id="a", text="Abcd. Efgh. Ijkl.")
            await ws.send("input.text", context_id="b", text="Mnop.")
            await ws.send("input.done", context_id="a")
            await ws.send("input.done", context_id="b")
            ends = set()
            while ends != {"a", "b"}:
                item = await ws.next()
                if isinstance(item, dict) and item["type"] not in ("audio.start", "audio.alignment", "audio.done"):
                    assert item["type"] == "context.done", item
                    ends.add(item["context_id"])
        families = _families(s)
    sentences = 4
    totals = _counts(families["indextts_total_seconds"])
    for name in (
        "indextts_queue_wait_seconds",
        "indextts_time_to_first_audio_seconds",
        "indextts_total_seconds",
        "indextts_real_time_factor",
    ):
        counts = _counts(families[name])
        assert sum(counts.values()) == sentences, (name, counts)
        assert {dict(labels)["engine"] for labels in counts} == {"fake"}
        assert {dict(labels)["member"] for labels in counts} <= {"0", "1"}
    assert sorted(totals.values()) in ([1.0, 3.0], [4.0])  # each context's sentences on its one member
    assert sum(_counts(families["indextts_segment_seconds"]).values()) == 2 * sentences
    # Each member loaded its model as serve started, so no sentence waited on a load; the fake
    # engine reports one stage.
    phases: dict[str, float] = {}
    for labels, count in _counts(families["indextts_sidecar_phase_seconds"]).items():
        phases[dict(labels)["phase"]] = phases.get(dict(labels)["phase"], 0) + count
    assert phases == {"queued": sentences, "synthesis": sentences}
    stages = _counts(families["indextts_engine_stage_seconds"])
    assert {dict(labels)["stage"] for labels in stages} == {"render"} and sum(stages.values()) == sentences
    # A sentence waits at most its time to first audio, which comes before its end.
    queue_wait, first = (
        _sums(families["indextts_queue_wait_seconds"]),
        _sums(families["indextts_time_to_first_audio_seconds"]),
    )
    assert 0 <= queue_wait <= first < _sums(families["indextts_total_seconds"])
    # alice's first sentence computed her conditioning, the next two reused it; alloy has none.
    cache = {
        sample.labels["result"]: sample.value
        for sample in families["indextts_voice_cache"].samples
        if sample.name == "indextts_voice_cache_total"
    }
    assert cache == {"miss": 1, "hit": 2}


async def test_options_that_would_set_the_clients_own_arguments_are_refused(srv: Server) -> None:
    async with session(srv) as ws:
        for name in ("timeout", "idle_timeout", "lookahead", "max_sentence_chars"):
            await ws.send("context.config", context_id="c", options={name: 1})
            refusal = await ws.next()
            assert refusal == {
                "type": "error",
                "code": "invalid_request_error",
                "message": f"options.{name} is not an engine option",
                "param": f"options.{name}",
                "context_id": "c",
            }


async def test_an_engine_without_the_capability_refuses_that_emotion() -> None:
    pytest.importorskip("espeakng_loader")
    with server("--engine", "espeak") as s:
        url = s.base.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with connect(url, open_timeout=WAIT) as raw:
            ws = Socket(raw)
            assert (await ws.next())["type"] == "session.ready"
            for field, value, what in (
                ("instructions", "cheerful", "emotion from a description"),
                ("emotion", {"happy": 0.5}, "emotion weights"),
                ("emotion_reference", "alloy", "emotion from a reference clip"),
            ):
                await ws.send("context.config", context_id="e", **{field: value})
                assert await ws.next() == {
                    "type": "error",
                    "code": "unsupported",
                    "message": f"engine 'espeak' has no {what} ({field})",
                    "param": field,
                    "context_id": "e",
                }
            await ws.send("input.text", context_id="e", text="Plain speech.")
            await ws.send("input.done", context_id="e")
            messages = await ws.until_done("e")
    assert messages[-1] == {"type": "context.done", "context_id": "e"}
    assert len(audio_of(messages)) > 0

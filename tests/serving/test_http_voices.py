"""Uploaded voices over HTTP: the openai package's ``audio.voices`` and httpx multipart, the
voice resolution rule, every refusal of the store as OpenAI error JSON, persistence across a
restart, and one store shared with the sidecar's ``register_voice``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("soundfile")

from http_support import AUTH, KEY, TIMEOUT, Server, server, speech  # noqa: E402
from voiceclips import clip  # noqa: E402

from indextts_client import Client  # noqa: E402
from indextts_sidecar.engines.fake import render_bytes  # noqa: E402


@pytest.fixture
def voice_dir(tmp_path: Path) -> Path:
    (tmp_path / "voices").mkdir()
    return tmp_path / "voices"


@pytest.fixture
def running(voice_dir: Path) -> Iterator[Server]:
    args = ("--max-voice-bytes", "200000", "--max-voice-names", "3", "--max-upload", "300000")
    with server("--engine", "fake", "--api-key", KEY, "--voice-dir", str(voice_dir), *args) as s:
        yield s


@pytest.fixture
def http(running: Server) -> Iterator[Any]:
    with httpx.Client(base_url=running.base, headers=AUTH, timeout=TIMEOUT) as client:
        yield client


FIELD = "audio_sample"


def _upload(http: Any, name: str, data: bytes, **fields: str) -> Any:
    return http.post("/v1/audio/voices", data={"name": name, **fields}, files={"audio_sample": ("a.wav", data)})


def _speak(http: Any, voice: Any) -> Any:
    return http.post("/v1/audio/speech", json=speech(input="hi", voice=voice, response_format="pcm"))


def test_the_openai_client_uploads_lists_uses_and_deletes_a_voice(running: Server) -> None:
    with openai.OpenAI(base_url=f"{running.base}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0) as c:
        voice = c.audio.voices.create(
            audio_sample=("alice.wav", clip(0.5), "audio/wav"), consent="cons_1", name="alice"
        )
        assert voice.id.startswith("voice_") and voice.name == "alice" and voice.object == "audio.voice"
        extra = voice.model_extra or {}
        assert extra["duration_s"] == pytest.approx(0.5) and extra["sample_rate"] == 24000
        for ref in ({"id": voice.id}, "alice", voice.id):
            audio = c.audio.speech.create(model="indextts", voice=ref, input="hi", response_format="pcm")  # type: ignore[arg-type]
            assert audio.content == render_bytes("hi")
        deleted = c.audio.voices.delete(voice.id)
        assert deleted.deleted and deleted.id == voice.id
        with pytest.raises(openai.BadRequestError) as refused:
            c.audio.speech.create(model="indextts", voice={"id": voice.id}, input="hi")
        assert refused.value.code == "unknown_voice"


def test_every_refusal_has_its_status_and_field(http: Any) -> None:
    huge = {"file": ("a.wav", b"x" * 400_000)}  # over --max-upload
    wrong_field = {"other": ("a", b"x")}
    cases = [
        (_upload(http, "junk", b"not audio at all" * 10), 400, "voice_invalid", "audio_sample"),
        (_upload(http, "empty", b""), 400, "voice_invalid", "audio_sample"),
        (_upload(http, "bad name!", clip()), 400, "voice_invalid", "name"),
        (_upload(http, "big", clip(5.0)), 413, "voice_too_large", "audio_sample"),  # 240 kB > 200 kB
        (http.post("/v1/audio/voices", files=huge, data={"name": "x"}), 413, "body_too_large", FIELD),
        (http.post("/v1/audio/voices", json={"name": "x"}), 415, "bad_content_type", None),
        (http.post("/v1/audio/voices", data={"name": "x"}, files=wrong_field), 400, "invalid_request_error", FIELD),
        (http.delete("/v1/audio/voices/voice_000000000000000000000000"), 404, "voice_not_found", "name"),
    ]  # fmt: skip
    for answer, status, code, param in cases:
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == (code, param), error
    first = _upload(http, "bob", clip(seed=1))
    assert first.status_code == 200
    taken = _upload(http, "bob", clip(seed=2))
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "voice_conflict"
    replaced = _upload(http, "bob", clip(seed=2), replace="true")
    assert replaced.status_code == 200 and replaced.json()["id"] == first.json()["id"]
    assert replaced.json()["sha256"] != first.json()["sha256"]
    assert _upload(http, "carol", clip(seed=3)).status_code == 200
    assert _upload(http, "dave", clip(seed=4)).status_code == 200
    full = _upload(http, "erin", clip(seed=5))  # --max-voice-names 3
    assert full.status_code == 413 and full.json()["error"]["code"] == "voice_store_full"
    assert [v["name"] for v in http.get("/v1/audio/voices").json()["data"] if v["source"] == "uploaded"] == [
        "bob",
        "carol",
        "dave",
    ]


def test_clips_in_the_voice_directory_and_nothing_outside_it(running: Server, http: Any, voice_dir: Path) -> None:
    (voice_dir / "narrator.wav").write_bytes(clip())
    outside = voice_dir.parent / "outside.wav"
    outside.write_bytes(clip())
    os.symlink(outside, voice_dir / "escape.wav")
    (voice_dir / "sub").mkdir()
    (voice_dir / "sub" / "deep.wav").write_bytes(clip())
    for voice in ("narrator.wav", "narrator"):
        answer = _speak(http, voice)
        assert answer.status_code == 200 and answer.content == render_bytes("hi")
    messages = set()
    for voice in ("escape.wav", "escape", "sub/deep.wav", "../outside.wav", str(outside), "index.json", "sub", "nope"):
        answer = _speak(http, voice)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "unknown_voice", voice
        messages.add(answer.json()["error"]["message"].replace(repr(voice[:64]), "V").replace("'<path>'", "V"))
    assert len(messages) == 1


def test_uploads_survive_a_restart(voice_dir: Path) -> None:
    with server("--engine", "fake", "--voice-dir", str(voice_dir)) as s, httpx.Client(base_url=s.base) as http:
        assert _upload(http, "kept", clip()).status_code == 200
    with server("--engine", "fake", "--voice-dir", str(voice_dir)) as s, httpx.Client(base_url=s.base) as http:
        assert [v["name"] for v in http.get("/v1/audio/voices").json()["data"] if v["source"] == "uploaded"] == ["kept"]
        assert _speak(http, "kept").status_code == 200


def test_the_voice_directory_must_exist(tmp_path: Path) -> None:
    import subprocess
    import sys

    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "indextts_client.http", "--engine", "fake", "--voice-dir", str(missing)],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2 and "is not a directory" in done.stderr


def test_without_a_voice_directory_there_are_no_uploads() -> None:
    with server("--engine", "fake") as s, httpx.Client(base_url=s.base) as http:
        answer = _upload(http, "x", clip())
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "voices_disabled"
        assert _speak(http, "alloy").status_code == 200  # OpenAI's names: the engine's default voice


def test_the_http_store_is_where_the_sidecar_keeps_its_own() -> None:
    from indextts_sidecar._voices import STORE_DIR
    from indextts_sidecar.voicestore import SIDECAR_SUBDIR

    assert SIDECAR_SUBDIR == STORE_DIR


@pytest.mark.anyio
async def test_one_store_for_http_uploads_and_the_sidecars_register_voice(voice_dir: Path) -> None:
    async with Client("fake", sidecar_args=["--voice-dir", str(voice_dir)]) as client:
        with anyio.fail_after(TIMEOUT):
            await client.register_voice("from-socket", clip(seed=7))
        with server("--engine", "fake", "--voice-dir", str(voice_dir)) as s:
            async with httpx.AsyncClient(base_url=s.base, timeout=TIMEOUT) as http:
                names = [
                    v["name"] for v in (await http.get("/v1/audio/voices")).json()["data"] if v["source"] == "uploaded"
                ]
                assert names == ["from-socket"]
                answer = await http.post(
                    "/v1/audio/voices", data={"name": "from-http"}, files={"audio_sample": ("a.wav", clip(seed=8))}
                )
                assert answer.status_code == 200
        with anyio.fail_after(TIMEOUT):
            audio = await client.synthesize("hi", voice="registered:from-http")
        assert audio.samples.tobytes() == render_bytes("hi")

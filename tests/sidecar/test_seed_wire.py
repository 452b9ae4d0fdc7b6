"""``--wire seed``: a parent written for the seed sidecar, from the seed's description alone.

The seed's docstring describes its wire: each frame is a 4-byte big-endian length and that
many bytes of UTF-8 JSON; the sidecar first says ``{"op": "ready", "engine", "sample_rate"}``;
``{"op": "ping"}`` is answered ``{"op": "pong"}``; ``{"op": "synthesize", "text", "ref_audio",
...}`` by ``progress`` frames (``stage``, ``percent``) and one ``{"op": "audio",
"audio_pcm_b64", "sample_rate", "n_samples"}`` (base64 int16); an unknown op by
``{"op": "error", "stage": "dispatch", "message": "unknown op: ..."}``, after which it goes on;
``{"op": "shutdown"}`` ends it with status 0, as does the end of its input.  There are no
request ids: one request at a time, answered in order.

:class:`SeedParent` is such a parent: blocking pipes, ``struct`` and ``json``, nothing of
this project's client or protocol package.  The last tests check the translation alone, in process.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union

import pytest
from harness import REPO, STANDIN, make_checkpoints, sidecar_command

from indextts_sidecar._seedwire import SeedWire
from indextts_sidecar._wire import InvalidRequest
from indextts_sidecar.engines.fake import render_bytes
from indextts_sidecar.protocol import EmotionAudio, EmotionText, EmotionVector, Error, Ok, Progress

#: Seconds any one reply may take; the fake engine answers in milliseconds.
TIMEOUT = 30.0


class SeedParent:
    """The parent side of the seed's wire, over a child's stdin and stdout."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._out = process.stdout.fileno()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out, selectors.EVENT_READ)

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(json.dumps(message).encode("utf-8"))

    def send_raw(self, body: bytes, length: Union[int, None] = None) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(struct.pack("!I", len(body) if length is None else length) + body)
        self.process.stdin.flush()

    def _read_exactly(self, count: int, deadline: float) -> bytes:
        data = b""
        while len(data) < count:
            if not self._selector.select(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"no reply within {TIMEOUT} s; got {data!r}")
            chunk = os.read(self._out, count - len(data))
            if not chunk:
                raise EOFError(f"the sidecar closed its stdout after {len(data)} of {count} bytes")
            data += chunk
        return data

    def receive(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        (size,) = struct.unpack("!I", self._read_exactly(4, deadline))
        message: dict[str, Any] = json.loads(self._read_exactly(size, deadline).decode("utf-8"))
        return message

    def at_end(self) -> bool:
        """Whether stdout ends here (after what was received), within the timeout."""
        if not self._selector.select(TIMEOUT):
            raise TimeoutError("stdout did not end")
        return os.read(self._out, 1) == b""

    def synthesize(self, **fields: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Send a synthesize; the progress frames before its answer, and the answer (audio or error)."""
        self.send({"op": "synthesize", **fields})
        progress = []
        while True:
            reply = self.receive()
            if reply["op"] != "progress":
                return progress, reply
            progress.append(reply)

    def wait(self) -> int:
        return self.process.wait(TIMEOUT)


@contextmanager
def seed_child(*args: str, engine: str = "fake", env: Union[dict[str, str], None] = None) -> Iterator[SeedParent]:
    full_env = {**os.environ, **(env or {})}
    process = subprocess.Popen(
        sidecar_command(engine, "--wire", "seed", *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=full_env,
    )
    try:
        yield SeedParent(process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(TIMEOUT)
        assert process.stdin is not None and process.stdout is not None
        process.stdin.close()
        process.stdout.close()


def _pcm(audio: dict[str, Any]) -> bytes:
    assert audio["op"] == "audio", audio
    pcm = base64.b64decode(audio["audio_pcm_b64"], validate=True)
    assert audio["n_samples"] == len(pcm) // 2
    return pcm


def test_ready_ping_synthesize_and_shutdown() -> None:
    with seed_child() as parent:
        assert parent.receive() == {"op": "ready", "engine": "fake", "sample_rate": 24000}
        parent.send({"op": "ping"})
        assert parent.receive() == {"op": "pong", "vram_mb": 0.0}
        # The seed's own parent sends these fields; the fake engine takes no emotion but neutral.
        progress, audio = parent.synthesize(text="hello seed", use_random=False, emo_alpha=1.0)
        assert [p["stage"] for p in progress if p["stage"] == "loading_model"] and progress[0]["percent"] == 0
        assert all(set(p) == {"op", "stage", "percent"} and 0 <= p["percent"] <= 100 for p in progress)
        assert audio["sample_rate"] == 24000
        assert _pcm(audio) == render_bytes("hello seed")
        # The fake engine reports words (word_timings); the seed's frame has no field for them.
        assert set(audio) == {"op", "audio_pcm_b64", "sample_rate", "n_samples"}
        # Loaded now: the second request's only frame is its audio, whole.
        progress, audio = parent.synthesize(text="again")
        assert [p["stage"] for p in progress if p["stage"] == "loading_model"] == []
        assert _pcm(audio) == render_bytes("again")
        parent.send({"op": "shutdown"})
        assert parent.at_end()
        assert parent.wait() == 0


def test_an_unknown_op_gets_the_seeds_error_and_the_sidecar_goes_on() -> None:
    with seed_child() as parent:
        parent.receive()
        parent.send({"op": "transcribe"})
        assert parent.receive() == {
            "op": "error",
            "stage": "dispatch",
            "code": "unknown_op",
            "message": "unknown op: 'transcribe'",
        }
        parent.send_raw(b"[1, 2]")  # JSON, but no object: no op
        assert parent.receive()["message"] == "unknown op: None"
        parent.send({"op": "ping"})
        assert parent.receive()["op"] == "pong"


def test_a_frame_that_is_not_json_is_answered_and_the_next_is_read() -> None:
    with seed_child() as parent:
        parent.receive()
        parent.send_raw(b"\xff{not json")
        error = parent.receive()
        assert (error["op"], error["stage"], error["code"]) == ("error", "recv", "invalid_message")
        assert error["message"].startswith("invalid_message: the frame is not JSON")
        parent.send({"op": "synthesize"})  # no text
        error = parent.receive()
        assert (error["stage"], error["code"], error["field"]) == ("synthesize", "invalid_message", "$.text")
        parent.send({"op": "ping"})
        assert parent.receive()["op"] == "pong"


def test_an_over_long_length_ends_the_sidecar_with_an_error_frame() -> None:
    with seed_child("--max-frame-size", "65536") as parent:
        parent.receive()
        parent.send_raw(b"", length=65537)
        error = parent.receive()
        assert (error["op"], error["stage"], error["code"]) == ("error", "recv", "frame_too_large")
        assert "65537" in error["message"] and "traceback" not in error
        assert parent.at_end()
        assert parent.wait() == 3  # framing lost (docs/protocol.md's exit codes)


def test_a_voice_outside_the_voice_dir_is_refused_without_its_path(tmp_path: Path) -> None:
    allowed, elsewhere = tmp_path / "voices", tmp_path / "elsewhere"
    allowed.mkdir()
    elsewhere.mkdir()
    (allowed / "alice.wav").write_bytes(b"RIFF stand-in")
    (elsewhere / "bob.wav").write_bytes(b"RIFF stand-in")
    with seed_child("--voice-dir", str(allowed)) as parent:
        parent.receive()
        _, error = parent.synthesize(text="hi", ref_audio=str(elsewhere / "bob.wav"))
        assert (error["op"], error["stage"], error["code"], error["field"]) == (
            "error",
            "synthesize",
            "invalid_input",
            "$.voice",
        )
        assert "outside the allowed directories" in error["message"]
        assert str(tmp_path) not in json.dumps(error) and "traceback" not in error
        _, audio = parent.synthesize(text="hi", ref_audio=str(allowed / "alice.wav"))
        assert _pcm(audio) == render_bytes("hi")


def test_a_path_with_spaces_and_quotes_is_never_shown_even_in_part(tmp_path: Path) -> None:
    allowed, elsewhere = tmp_path / "voices", tmp_path / 'my "odd" voices'
    allowed.mkdir()
    with seed_child("--voice-dir", str(allowed)) as parent:
        parent.receive()
        for name in ("bob smith.wav", "o'brien.wav"):
            _, error = parent.synthesize(text="hi", ref_audio=str(elsewhere / name))
            assert error["code"] == "invalid_input" and "outside the allowed directories" in error["message"]
            assert "voices" not in error["message"] and name not in error["message"], error["message"]
            assert "'<path>'" in error["message"]


def test_options_nested_past_the_limit_are_refused_on_every_python() -> None:
    deep: Any = "leaf"
    for _ in range(200):  # 3.13's decoder takes this; 3.10-3.12 take it too (under 1,000 levels)
        deep = [deep]
    with seed_child() as parent:
        parent.receive()
        _, error = parent.synthesize(text="hi", options={"nested": deep})
        assert (error["op"], error["code"], error["field"]) == ("error", "invalid_message", "$.options")
        assert "deeper than 64 levels" in error["message"]
        _, audio = parent.synthesize(text="hi")  # and the sidecar goes on
        assert _pcm(audio) == render_bytes("hi")


def test_an_engine_that_prints_to_stdout_does_not_corrupt_the_wire() -> None:
    with seed_child() as parent:
        parent.receive()
        # ``options`` is this sidecar's addition: the fake engine prints when asked to.
        _, audio = parent.synthesize(text="loud", options={"print_lines": 6})
        assert _pcm(audio) == render_bytes("loud")
        parent.send({"op": "ping"})
        assert parent.receive()["op"] == "pong"


def test_requests_sent_together_are_answered_one_at_a_time_in_order() -> None:
    with seed_child() as parent:
        parent.receive()
        # No ids: a parent that writes ahead tells the answers apart by their order alone.
        parent.send({"op": "synthesize", "text": "first"})
        parent.send({"op": "ping"})
        parent.send({"op": "synthesize", "text": "second"})
        replies = []
        while len(replies) < 3:
            reply = parent.receive()
            if reply["op"] != "progress":
                replies.append(reply)
        assert [r["op"] for r in replies] == ["audio", "pong", "audio"]
        assert (_pcm(replies[0]), _pcm(replies[2])) == (render_bytes("first"), render_bytes("second"))


def test_the_end_of_input_ends_the_sidecar_cleanly() -> None:
    with seed_child() as parent:
        parent.receive()
        parent.send({"op": "ping"})
        assert parent.receive()["op"] == "pong"
        assert parent.process.stdin is not None
        parent.process.stdin.close()
        assert parent.at_end()  # nothing after the pong: the seed ends silently
        assert parent.wait() == 0


def test_audio_longer_than_one_frame_is_refused_not_cut() -> None:
    with seed_child("--max-frame-size", "65536") as parent:
        parent.receive()
        # 2 s at 24 kHz: 96,000 bytes of samples, 128,000 in base64, more than the 64 KiB frame.
        _, error = parent.synthesize(text="x", options={"seconds": 2.0})
        assert (error["op"], error["stage"], error["code"]) == ("error", "synthesize", "invalid_input")
        assert "longer than one frame" in error["message"]
        _, audio = parent.synthesize(text="short")
        assert _pcm(audio) == render_bytes("short")


def test_the_seeds_fields_reach_indextts2_as_the_seed_forwarded_them(tmp_path: Path, voice: str) -> None:
    ckpt = make_checkpoints(tmp_path / "checkpoints")
    log = tmp_path / "calls.jsonl"
    clip = tmp_path / "emotion.wav"
    clip.write_bytes(b"RIFF stand-in emotion")
    env = {"INDEXTTS_STANDIN_LOG": str(log), "PYTHONPATH": os.pathsep.join([str(STANDIN / "v2"), REPO])}
    with seed_child("-o", f"model_dir={ckpt}", engine="indextts2", env=env) as parent:
        assert parent.receive() == {"op": "ready", "engine": "indextts2", "sample_rate": 22050}
        progress, audio = parent.synthesize(text="hi", ref_audio=voice, use_random=True)
        assert {p["stage"] for p in progress} >= {"loading_model"} and progress[-1]["percent"] <= 100
        assert audio["sample_rate"] == 22050 and len(_pcm(audio)) > 0
        _, audio = parent.synthesize(text="hi", ref_audio=voice, emo_audio=str(clip), emo_alpha=0.75)
        assert audio["op"] == "audio"
        _, audio = parent.synthesize(text="hi", ref_audio=voice, emo_text="wistful", use_emo_text=True, emo_alpha=0.9)
        assert audio["op"] == "audio"
        parent.send({"op": "shutdown"})
        assert parent.wait() == 0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    infer = [c["kwargs"] for c in calls if c["event"] == "infer"]
    base = {"spk_audio_prompt": voice, "text": "hi", "output_path": None, "stream_return": True}
    assert infer[0] == {**base, "use_random": True}
    assert infer[1] == {**base, "emo_audio_prompt": str(clip), "emo_alpha": 0.75}
    assert infer[2] == {**base, "use_emo_text": True, "emo_text": "wistful", "emo_alpha": 0.9}


def test_a_sidecar_that_cannot_start_says_so_in_a_seed_error_frame() -> None:
    for args, code, field in (
        (["--engine", "no-such-engine"], "unknown_engine", "--engine"),
        (["--listen", "unix:///nonexistent/x.sock"], "invalid_option", "--wire"),
    ):
        command = [*sidecar_command("fake", "--wire", "seed"), *args]
        out = subprocess.run(command, input=b"", capture_output=True, timeout=TIMEOUT, check=False)
        assert out.returncode == 2, out.stderr
        (size,) = struct.unpack("!I", out.stdout[:4])
        assert len(out.stdout) == 4 + size
        error = json.loads(out.stdout[4:])
        assert (error["op"], error["stage"], error["code"], error["field"]) == ("error", "startup", code, field)


# ------------------------------------------------ the translation alone, without a process


def _decode(message: dict[str, Any]) -> Any:
    return SeedWire().decode(memoryview(json.dumps(message).encode()))


def test_the_emotion_fields_become_one_emotion_text_first_then_vector_then_audio() -> None:
    vector = [0.5, 0, 0, 0, 0, 0, 0.25, 0]
    both = _decode({"op": "synthesize", "text": "t", "emo_vector": vector, "emo_audio": "e.wav", "emo_alpha": 0.5})
    assert both.emotion == EmotionVector(happy=0.5, surprised=0.25, alpha=0.5)
    text = _decode({"op": "synthesize", "text": "t", "emo_vector": vector, "emo_text": "calm"})
    assert text.emotion == EmotionText(text="calm", alpha=1.0)
    ignored = _decode({"op": "synthesize", "text": "t", "emo_text": "calm", "use_emo_text": False})
    assert ignored.emotion is None  # upstream reads emo_text only with use_emo_text
    audio = _decode({"op": "synthesize", "text": "t", "emo_audio_prompt": "e.wav"})
    assert audio.emotion == EmotionAudio(path="e.wav", alpha=1.0)
    request = _decode({"op": "synthesize", "text": "t", "ref_audio": "v.wav", "use_random": True})
    assert (request.voice, request.options) == ("v.wav", {"use_random": True})
    assert _decode({"op": "synthesize", "text": "t", "use_random": False}).options == {}


def test_requests_get_increasing_ids_and_bad_fields_name_their_path() -> None:
    wire = SeedWire()
    ids = [wire.decode(memoryview(json.dumps({"op": op}).encode())).id for op in ("ping", "ping", "shutdown")]
    assert ids == [1, 2, 3]
    with pytest.raises(InvalidRequest) as caught:
        wire.decode(memoryview(b'{"op": "synthesize", "text": "t", "emo_vector": [1, 2]}'))
    assert caught.value.error.detail == {"stage": "synthesize", "field": "$.emo_vector"}


def test_replies_without_a_seed_frame_are_not_sent_and_paths_never_shown() -> None:
    wire = SeedWire()
    assert wire.encode(Progress(id=1, stage="synthesize", fraction=None)) is None
    assert wire.encode(Ok(id=1)) is None
    assert wire.encode(Error(code="shutting_down", message="stopping")) is None
    (frame,) = wire.encode(Error(code="engine_error", id=4, message="OSError: '/srv/models/x.bin' is gone")) or ()
    assert json.loads(frame[4:]) == {
        "op": "error",
        "stage": "synthesize",
        "code": "engine_error",
        "message": "engine_error: OSError: '<path>' is gone",
    }

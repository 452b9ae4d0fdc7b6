"""The IndexTTS engines in a real ``python -m indextts_sidecar`` child, over the protocol.

The child imports a stand-in ``indextts`` (tests/standin) through PYTHONPATH.  The frame
reader here is our own, a few lines over anyio, so these tests depend on neither the
client package nor the sidecar's reader.  Coordination with the stand-in goes through
files (gates, markers, a call log), never through sleeps.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Union

import anyio
import numpy as np
import pytest
from harness import STANDIN, Peer, make_checkpoints, spawn

from indextts_sidecar import protocol
from indextts_sidecar.engines.indextts import AUX_FILES, CHECKPOINT_FILES
from indextts_sidecar.protocol import (
    Audio,
    Cancel,
    Done,
    EmotionAudio,
    EmotionText,
    EmotionVector,
    Error,
    Load,
    Ok,
    Ping,
    Pong,
    Progress,
    Ready,
    Reply,
    Synthesize,
    Unload,
)

pytestmark = pytest.mark.anyio

TIMEOUT = 30


class Child(Peer):
    """A sidecar over a stand-in ``indextts``, whose calls the stand-in logs as JSON lines."""

    log: Path
    ready: Ready

    async def ping(self, request_id: int) -> Pong:
        (pong,) = [f for f in await self.request(Ping(id=request_id)) if isinstance(f, Pong)]
        return pong

    def calls(self, event: Union[str, None] = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        entries = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [e for e in entries if event is None or e["event"] == event]


@asynccontextmanager
async def child(
    tmp_path: Path,
    engine: str,
    *options: str,
    flavour: Union[str, None] = "v2",
    torch: bool = False,
    env: Union[dict[str, str], None] = None,
) -> AsyncIterator[Child]:
    """Spawn ``python -m indextts_sidecar --engine ENGINE -o ...`` with a stand-in flavour; read ``ready``."""
    log = tmp_path / f"calls-{engine}.jsonl"
    paths = [str(STANDIN / flavour)] if flavour else []
    if torch:
        paths.append(str(STANDIN / "torchstub"))
    args = [arg for option in options for arg in ("-o", option)]
    full_env = {"INDEXTTS_STANDIN_LOG": str(log), **(env or {})}
    async with spawn(engine, *args, env=full_env, pythonpath=paths, peer_class=Child) as peer:
        peer.log = log
        peer.ready = await peer.expect(Ready)
        yield peer


@pytest.fixture
def ckpt25(tmp_path: Path) -> Path:
    """A complete stand-in IndexTTS-2.5 checkpoint folder."""
    return make_checkpoints(tmp_path / "checkpoints-2.5", version="2.5")


def _audio(frames: list[Reply]) -> list[Audio]:
    audio = [f for f in frames if isinstance(f, Audio)]
    assert [a.seq for a in audio] == list(range(len(audio)))
    return audio


def _error(frames: list[Reply]) -> Error:
    error = frames[-1]
    assert isinstance(error, Error), frames
    return error


# ----------------------------------------------------------------- ready, load, synthesize


@pytest.mark.parametrize("engine", ["indextts2", "indextts2.5", "indextts"])
async def test_ready_reports_the_native_rate_before_loading(engine: str, tmp_path: Path, ckpt: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, engine, f"model_dir={ckpt}", flavour="v25") as peer:
            ready = peer.ready
            assert ready is not None and ready.engine == engine and ready.sample_rate == 22050
            assert "streaming" in ready.capabilities
            assert ready.options["model_dir"] == str(ckpt)
            assert (await peer.ping(1)).loaded is False
            assert peer.calls() == [], "nothing imported or constructed before a request"


async def test_synthesis_streams_segments_and_survives_upstream_prints(tmp_path: Path, ckpt: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}") as peer:
            frames = await peer.request(Load(id=1))
            load = [f for f in frames if isinstance(f, Progress)]
            assert [p.fraction for p in load][:3] == [0.0, 0.1, 0.3] and load[-1].fraction == 1.0
            info = frames[-1].info if isinstance(frames[-1], Ok) else {}
            assert info["sample_rate"] == 22050 and info["loaded"] is True
            assert (info["model_version"], info["module"]) == ("2", "indextts.infer_v2")
            for request_id in (2, 3, 4):  # upstream prints about ten lines per request
                options = {"max_text_tokens_per_segment": 2, "interval_silence": 100}
                frames = await peer.request(Synthesize(id=request_id, text="a b c d e", voice=voice, options=options))
                done = frames[-1]
                assert isinstance(done, Done), frames
                audio = _audio(frames)
                # Silence between segments only: none after the last, as without streaming.
                assert [len(a.pcm) // 2 for a in audio] == [4410, 2205, 4410, 2205, 2205]
                assert done.sample_rate == 22050 and done.samples == 15435 and done.chunks == 5
                assert all(a.sample_rate == 22050 for a in audio)
                assert bytes(audio[1].pcm) == bytes(audio[3].pcm) == bytes(4410)
                assert bytes(audio[4].pcm) != bytes(4410)
                stages = [f.stage for f in frames if isinstance(f, Progress)]
                assert "prepare" in stages and stages.index("prepare") < stages.index("synthesize")
                segments = [f.message for f in frames if isinstance(f, Progress) and f.message.startswith("segment")]
                assert segments == [
                    "segment 1 ready (0.20 s of audio)",
                    "segment 2 ready (0.50 s of audio)",
                    "segment 3 ready (0.70 s of audio)",
                ]
                # Each segment's words (upstream's, upper-cased by its tokenizer) come before its audio.
                said = [
                    f.message if isinstance(f, Progress) else len(f.pcm) // 2
                    for f in frames
                    if isinstance(f, Audio) or (isinstance(f, Progress) and f.message.startswith("text: "))
                ]
                assert said == ["text: A B", 4410, 2205, "text: C D", 4410, 2205, "text: E", 2205]
            assert (await peer.ping(9)).loaded is True
            assert "stand-in infer: print() line" in peer.stderr()
            assert "stand-in infer: raw fd 1 line" in peer.stderr()


@pytest.mark.parametrize("flavour", ["v2", "pypi"])
async def test_audio_is_bit_exact_over_the_wire(flavour: str, tmp_path: Path, ckpt: Path, voice: str) -> None:
    every = np.arange(-32768, 32768, dtype="<i2")
    speech = tmp_path / "speech.raw"
    speech.write_bytes(every.tobytes())
    env = {"INDEXTTS_STANDIN_AUDIO": str(speech)}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", flavour=flavour, env=env) as peer:
            options = {"interval_silence": 0, "max_text_tokens_per_segment": 2}
            frames = await peer.request(Synthesize(id=1, text="a b c d e", voice=voice, options=options))
            assert isinstance(frames[-1], Done)
            assert b"".join(bytes(a.pcm) for a in _audio(frames)) == every.tobytes()


# ----------------------------------------------------------------- option mapping


async def test_every_option_reaches_upstream_as_a_keyword(tmp_path: Path, ckpt: Path, voice: str) -> None:
    engine_options = [
        f"model_dir={ckpt}",
        "device=cpu",
        "fp16=true",
        "use_cuda_kernel=false",
        "use_deepspeed=false",
        "use_accel=true",
        "use_torch_compile=true",
        "use_qwen_emo=true",
    ]
    request_options = {
        "use_random": True,
        "interval_silence": 50,
        "max_text_tokens_per_segment": 60,
        "more_segment_before": 1,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "num_beams": 2,
        "repetition_penalty": 8.0,
        "length_penalty": 0.5,
        "max_mel_tokens": 1200,
    }
    clip = tmp_path / "emotion.wav"
    clip.write_bytes(b"RIFF")
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", *engine_options) as peer:
            assert isinstance(
                (await peer.request(Synthesize(id=1, text="hi", voice=voice, options=request_options)))[-1], Done
            )
            emotions: list[protocol.Emotion] = [
                EmotionVector(happy=0.25, surprised=0.5, alpha=0.5),
                EmotionAudio(path=str(clip), alpha=0.75),
                EmotionText(text="wistful", alpha=0.9),
            ]
            for request_id, emotion in enumerate(emotions, start=2):
                frames = await peer.request(Synthesize(id=request_id, text="hi", voice=voice, emotion=emotion))
                assert isinstance(frames[-1], Done), frames
        (init,) = peer.calls("__init__")
        assert init["args"] == [] and init["module"] == "indextts.infer_v2"
        assert init["kwargs"] == {
            "model_dir": str(ckpt),
            "cfg_path": str(ckpt / "config.yaml"),
            "device": "cpu",
            "use_fp16": True,
            "use_cuda_kernel": False,
            "use_deepspeed": False,
            "use_accel": True,
            "use_torch_compile": True,
            "use_qwen_emo": True,
            "aux_paths": {
                "w2v_bert": str(ckpt / "hf_cache" / "w2v-bert-2.0"),
                "semantic_codec": str(ckpt / "hf_cache" / "semantic_codec_model.safetensors"),
                "campplus": str(ckpt / "hf_cache" / "campplus_cn_common.bin"),
                "bigvgan": str(ckpt / "hf_cache" / "bigvgan"),
            },
        }
        plain, vector, audio, text = peer.calls("infer")
        base = {"spk_audio_prompt": voice, "text": "hi", "output_path": None, "stream_return": True}
        assert all(c["args"] == [] for c in (plain, vector, audio, text))
        assert plain["kwargs"] == {**base, **request_options}
        # Scaled as upstream's web UI does (happy x 0.9375, surprised x 0.6875; sum under 0.8).
        assert vector["kwargs"] == {**base, "emo_vector": [0.234375, 0, 0, 0, 0, 0, 0.34375, 0], "emo_alpha": 0.5}
        assert audio["kwargs"] == {**base, "emo_audio_prompt": str(clip), "emo_alpha": 0.75}
        assert text["kwargs"] == {**base, "use_emo_text": True, "emo_text": "wistful", "emo_alpha": 0.9}


async def test_25_options_reach_upstream(tmp_path: Path, ckpt25: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2.5", f"model_dir={ckpt25}", "bf16=true", "lang=zh", flavour="v25") as peer:
            options = {"lang": "JA", "duration_factor": 0.5, "text_normalization": False}
            assert isinstance((await peer.request(Synthesize(id=1, text="a", voice=voice, options=options)))[-1], Done)
            assert isinstance((await peer.request(Synthesize(id=2, text="a", voice=voice)))[-1], Done)
            # 2.5 never reads more_segment_before: refused rather than silently ignored.
            frames = await peer.request(Synthesize(id=3, text="a", voice=voice, options={"more_segment_before": 2}))
            error = _error(frames)
            assert (error.code, error.detail["field"]) == ("unknown_option", "$.options.more_segment_before")
        (init,) = peer.calls("__init__")
        assert init["module"] == "indextts.infer_v2_5"
        assert init["kwargs"] == {"model_dir": str(ckpt25), "cfg_path": str(ckpt25 / "config.yaml"), "use_bf16": True}
        explicit, default = peer.calls("infer")
        assert {k: explicit["kwargs"][k] for k in options} == {**options, "lang": "ja"}
        assert default["kwargs"]["lang"] == "zh", "the engine option lang is the default"
        assert "duration_factor" not in default["kwargs"]


async def test_pypi_flavour_mapping(tmp_path: Path, ckpt: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(
            tmp_path, "indextts", f"model_dir={ckpt}", "fp16=true", "use_accel=true", flavour="pypi"
        ) as peer:
            options = {"quick_streaming_tokens": 4}
            assert isinstance((await peer.request(Synthesize(id=1, text="a", voice=voice, options=options)))[-1], Done)
            pong = await peer.ping(2)
            assert pong.dropped_options == [], "2.1.1 takes use_accel"
            frames = await peer.request(Synthesize(id=3, text="a", voice=voice, options={"more_segment_before": 1}))
            error = _error(frames)
            assert (error.code, error.detail["field"]) == ("unknown_option", "$.options.more_segment_before")
            assert "indextts2-inference" in error.message
        (init,) = peer.calls("__init__")
        expected = {"model_dir": str(ckpt), "cfg_path": str(ckpt / "config.yaml"), "use_fp16": True, "use_accel": True}
        assert init["kwargs"] == expected, "no aux_paths: 2.1.1 reads the Hugging Face cache"
        (infer,) = peer.calls("infer")
        assert infer["kwargs"]["quick_streaming_tokens"] == 4


async def test_dropped_options_are_reported_in_pong(tmp_path: Path, ckpt25: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts", f"model_dir={ckpt25}", "fp16=true", "bf16=true", flavour="v25") as peer:
            assert (await peer.ping(1)).dropped_options == []
            assert isinstance((await peer.request(Load(id=2)))[-1], Ok)
            assert (await peer.ping(3)).dropped_options == ["fp16"]
            assert "'fp16' is not accepted" in peer.stderr()


# ----------------------------------------------------------------- validation


REJECTED = [
    # (request fields, code, field): all refused before the model is touched
    ({"options": {"nope": 1}}, "unknown_option", "$.options.nope"),
    ({"options": {"lang": "en"}}, "unknown_option", "$.options.lang"),
    ({"options": {"duration_factor": 1.0}}, "unknown_option", "$.options.duration_factor"),
    ({"options": {"temperature": 0}}, "invalid_option", "$.options.temperature"),
    ({"options": {"top_p": 2}}, "invalid_option", "$.options.top_p"),
    ({"options": {"top_k": -1}}, "invalid_option", "$.options.top_k"),
    ({"options": {"num_beams": 0}}, "invalid_option", "$.options.num_beams"),
    ({"options": {"repetition_penalty": -1}}, "invalid_option", "$.options.repetition_penalty"),
    ({"options": {"max_mel_tokens": 0}}, "invalid_option", "$.options.max_mel_tokens"),
    ({"options": {"interval_silence": -5}}, "invalid_option", "$.options.interval_silence"),
    ({"options": {"max_text_tokens_per_segment": 0}}, "invalid_option", "$.options.max_text_tokens_per_segment"),
    ({"options": {"more_segment_before": -1}}, "invalid_option", "$.options.more_segment_before"),
    ({"options": {"use_random": "maybe"}}, "invalid_option", "$.options.use_random"),
    ({"options": {"seed": -1}}, "invalid_option", "$.options.seed"),
    ({"options": {"normalize_emotion": "no"}}, "invalid_option", "$.options.normalize_emotion"),
    ({"voice": None}, "invalid_input", "$.voice"),
    ({"voice": "/nonexistent/speaker.wav"}, "invalid_input", "$.voice"),
    ({"text": "   "}, "invalid_input", "$.text"),
    ({"text": "..."}, "invalid_input", "$.text"),
    ({"emotion": EmotionVector(happy=1.2)}, "invalid_input", "$.emotion.happy"),
    (
        {"emotion": EmotionVector(angry=0.7, sad=0.4), "options": {"normalize_emotion": False}},
        "invalid_input",
        "$.emotion",
    ),
    ({"emotion": EmotionAudio(path="/nonexistent/e.wav")}, "invalid_input", "$.emotion.path"),
    ({"emotion": EmotionText(text="x")}, "invalid_input", "$.emotion"),  # -o use_qwen_emo=false below
]


async def test_invalid_requests_are_rejected_naming_the_field(tmp_path: Path, ckpt: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", "use_qwen_emo=false") as peer:
            for request_id, (fields, code, field) in enumerate(REJECTED, start=1):
                message = Synthesize(id=request_id, **{"text": "hello", "voice": voice, **fields})
                frames = await peer.request(message)
                assert len(frames) == 1, frames
                error = _error(frames)
                assert (error.code, error.detail.get("field")) == (code, field), error
            # Still serving, nothing loaded: every rejection came before the model.
            assert (await peer.ping(100)).loaded is False
        assert peer.calls() == []


async def test_flavour_dependent_rejections_after_load(tmp_path: Path, ckpt25: Path, voice: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2.5", f"model_dir={ckpt25}", flavour="v25") as peer:
            frames = await peer.request(Synthesize(id=1, text="hi", voice=voice, emotion=EmotionText(text="joy")))
            error = _error(frames)
            assert (error.code, error.detail["field"]) == ("invalid_input", "$.emotion")
            assert "use_qwen_emo=true" in error.message
            frames = await peer.request(Synthesize(id=2, text="hi", voice=voice, options={"quick_streaming_tokens": 3}))
            assert _error(frames).code == "unknown_option", "quick_streaming_tokens is the PyPI flavour's"
            assert _error(frames).detail["field"] == "$.options.quick_streaming_tokens"
            frames = await peer.request(Synthesize(id=3, text="hi", voice=voice, options={"duration_factor": 3}))
            assert (_error(frames).code, _error(frames).detail["field"]) == (
                "invalid_option",
                "$.options.duration_factor",
            )
        assert peer.calls("infer") == [], "upstream never saw a request it would have failed on"


async def test_auto_on_a_2_directory_rejects_25_options(tmp_path: Path, ckpt: Path, voice: str) -> None:
    # The code of both versions is installed: the checkpoint directory decides, before any load.
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts", f"model_dir={ckpt}", "lang=zh", flavour="v25") as peer:
            frames = await peer.request(Synthesize(id=1, text="hi", voice=voice, options={"lang": "en"}))
            assert len(frames) == 1
            error = _error(frames)
            assert (error.code, error.detail["field"]) == ("unknown_option", "$.options.lang")
            assert "IndexTTS-2" in error.message
            assert (await peer.ping(2)).loaded is False
            assert isinstance((await peer.request(Synthesize(id=3, text="hi", voice=voice)))[-1], Done)
            assert (await peer.ping(4)).dropped_options == ["lang"]
        (init,) = peer.calls("__init__")
        assert init["module"] == "indextts.infer_v2"
        (infer,) = peer.calls("infer")
        assert "lang" not in infer["kwargs"]


# ----------------------------------------------------------------- streaming and cancel


async def test_first_audio_arrives_before_the_second_of_ten_segments(tmp_path: Path, ckpt: Path, voice: str) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {"INDEXTTS_STANDIN_GATE_DIR": str(gate)}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", env=env) as peer:
            text = " ".join(f"w{i}" for i in range(10))
            await peer.send(Synthesize(id=1, text=text, voice=voice, options={"max_text_tokens_per_segment": 1}))
            frame = await peer.reply()
            while not isinstance(frame, Audio):
                assert not protocol.is_terminal(frame), frame
                frame = await peer.reply()
            # Segment 2 waits for the gate, so this audio cannot have been buffered behind it.
            assert frame.seq == 0 and len(frame.pcm) == 2 * 2205
            assert (gate / "produced-1").exists() and not (gate / "produced-2").exists()
            (gate / "open").touch()
            frames = [frame, *await peer.until_terminal(1)]
            done = frames[-1]
            assert isinstance(done, Done) and done.chunks == 19  # ten segments, a silence between each two
            assert done.samples == 10 * 2205 + 9 * 4410
            assert done.timings["first_audio"] < done.timings["total"]
            assert all((gate / f"produced-{k}").exists() for k in range(1, 11))


async def test_cancel_takes_effect_between_segments(tmp_path: Path, ckpt: Path, voice: str) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {"INDEXTTS_STANDIN_GATE_DIR": str(gate)}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", env=env) as peer:
            text = " ".join(f"w{i}" for i in range(10))
            await peer.send(Synthesize(id=1, text=text, voice=voice, options={"max_text_tokens_per_segment": 1}))
            frames: list[Reply] = []
            # Segment 1; its silence is held back until segment 2 arrives, and segment 2 is gated.
            while len(_audio(frames)) < 1:
                frames.append(await peer.reply())
            await peer.send(Cancel(id=2, target=1))
            # Once the cancel is acknowledged (it is set by then), let the stand-in produce
            # segment 2 (only), in case the engine was already waiting for it.
            while not any(isinstance(f, Ok) and f.id == 2 for f in frames):
                frames.append(await peer.reply())
            (gate / "segment-2").touch()
            if not any(isinstance(f, Error) and f.id == 1 for f in frames):
                frames += await peer.until_terminal(1)
            acks = [f for f in frames if isinstance(f, Ok) and f.id == 2]
            assert acks and acks[0].info == {"found": True}
            assert _error(frames).code == "cancelled"
            assert len(_audio(frames)) == 1, "nothing after the cancel reached the wire"
            assert len(_audio(frames)[0].pcm) == 2 * 2205
            assert not (gate / "produced-3").exists()
            # The sidecar and the model stay usable.
            (gate / "open").touch()
            assert isinstance((await peer.request(Synthesize(id=3, text="a", voice=voice)))[-1], Done)
        # Upstream's generator was closed, not drained: at most the gated segment 2 was produced.
        closed = peer.calls("closed")
        assert len(closed) == 1 and closed[0]["produced"] in (1, 2)
        assert len(peer.calls("finished")) == 1, "only request 3 ran to the end"


async def test_a_failure_while_preparing_the_references(tmp_path: Path, ckpt: Path, voice: str) -> None:
    # Upstream reads the references at the first next() of its stream: a voice that passed the
    # checks and is gone by then fails there, reported as such, and the sidecar serves on.
    gate = tmp_path / "gate"
    gate.mkdir()
    doomed = tmp_path / "doomed.wav"
    doomed.write_bytes(b"RIFF doomed")
    env = {"INDEXTTS_STANDIN_GATE_DIR": str(gate)}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", env=env) as peer:
            # Request 1 holds the engine thread: its segment 2 waits for the gate.
            await peer.send(Synthesize(id=1, text="a b", voice=voice, options={"max_text_tokens_per_segment": 1}))
            await peer.send(Synthesize(id=2, text="hi", voice=str(doomed)))
            await peer.send(Ping(id=3))  # answered once request 2 has passed its checks
            frames: list[Reply] = []
            while not any(isinstance(f, Pong) for f in frames):
                frames.append(await peer.reply())
            doomed.unlink()
            (gate / "open").touch()
            while not {1, 2} <= {f.id for f in frames if protocol.is_terminal(f) and isinstance(f, (Done, Error))}:
                frames.append(await peer.reply())
            error = _error([f for f in frames if getattr(f, "id", None) == 2])
            assert error.code == "engine_error" and error.detail["field"] == "$.voice"
            assert error.message.startswith("preparing the references failed: FileNotFoundError: ")
            stages = [f.stage for f in frames if isinstance(f, Progress) and f.id == 2]
            assert "prepare" in stages and "synthesize" not in stages
            assert not [f for f in frames if isinstance(f, Audio) and f.id == 2]
            assert isinstance([f for f in frames if getattr(f, "id", None) == 1][-1], Done)
            assert isinstance((await peer.request(Synthesize(id=4, text="hi", voice=voice)))[-1], Done)
        assert [e["index"] for e in peer.calls("segment")] == [1, 2, 1], "request 2 produced nothing"


async def test_voices_are_cached_and_load_reports_it(tmp_path: Path, ckpt: Path) -> None:
    voices = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.wav"
        path.write_bytes(f"RIFF voice {name}".encode())
        voices.append(str(path))
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}") as peer:
            results = []
            for request_id, voice in enumerate([*voices, voices[0], voices[1]], start=1):
                done = (await peer.request(Synthesize(id=request_id, text="hi", voice=voice)))[-1]
                assert isinstance(done, Done)
                results.append(done.facts["voice_cache"])
            assert results == ["miss", "miss", "hit", "hit"]  # each request's done says which it was
            # The stage times upstream printed, parsed by the adapter (the stand-in prints these).
            assert done.facts["stages"] == {"gpt_gen": 0.25, "gpt_forward": 0.05, "s2mel": 0.12, "bigvgan": 0.03}
            ok = (await peer.request(Load(id=9)))[-1]
            assert isinstance(ok, Ok) and ok.info["loaded"] is True
            assert ok.info["voice_cache"] == {"size": 4, "entries": 2, "hits": 2, "misses": 2}
            assert ok.info["model_dir"] == str(ckpt) and ok.info["model_version"] == "2"
        speakers = [e["path"] for e in peer.calls("reference") if e["role"] == "speaker"]
        assert speakers == voices, "each voice processed once"


# ----------------------------------------------------------------- load failures


@pytest.mark.parametrize(
    ("engine", "version", "other"), [("indextts2.5", "2", "indextts2"), ("indextts2", "2.5", "indextts2.5")]
)
async def test_the_directory_decides_the_version(
    engine: str, version: str, other: str, tmp_path: Path, voice: str
) -> None:
    ckpt = make_checkpoints(tmp_path / "ckpt", version=version)
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, engine, f"model_dir={ckpt}", flavour="v25") as peer:
            error = _error(await peer.request(Synthesize(id=1, text="hi", voice=voice)))
            assert (error.code, error.detail["field"]) == ("load_failed", "model_dir")
            assert f"holds an IndexTTS-{version} model" in error.message and f"--engine {other}" in error.message
        assert peer.calls() == [], "refused before importing upstream"
        async with child(tmp_path, "indextts", f"model_dir={ckpt}", flavour="v25") as peer:
            ok = (await peer.request(Load(id=1)))[-1]
            assert isinstance(ok, Ok) and ok.info["model_version"] == version
            assert ok.info["module"] == ("indextts.infer_v2_5" if version == "2.5" else "indextts.infer_v2")


async def test_load_failure_then_retry(tmp_path: Path, ckpt: Path, voice: str) -> None:
    env = {"INDEXTTS_STANDIN_FAIL_CONSTRUCTS": "1", "INDEXTTS_STANDIN_COUNTER": str(tmp_path / "constructs")}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", env=env) as peer:
            frames = await peer.request(Synthesize(id=1, text="hi", voice=voice))
            error = _error(frames)
            assert error.code == "load_failed" and error.retryable
            assert "injected construct failure 1 of 1" in error.message
            assert (await peer.ping(2)).loaded is False
            frames = await peer.request(Synthesize(id=3, text="hi", voice=voice))
            assert isinstance(frames[-1], Done), frames
            assert (await peer.ping(4)).loaded is True
        assert len(peer.calls("__init__")) == 2


async def test_slow_construction_is_timed_and_queued_requests_hear_of_it(
    tmp_path: Path, ckpt: Path, voice: str
) -> None:
    env = {"INDEXTTS_STANDIN_CONSTRUCT_SECONDS": "0.5"}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", env=env) as peer:
            # One write: request 2 is queued before the engine thread can reach the construct step.
            both = protocol.frame(Synthesize(id=1, text="a", voice=voice)) + protocol.frame(
                Synthesize(id=2, text="b", voice=voice)
            )
            await peer.stdin.send(both)
            frames = await peer.until_terminal(1)
            frames += await peer.until_terminal(2)
            first = frames[[getattr(f, "id", None) for f in frames].index(1)]
            done = [f for f in frames if isinstance(f, Done)]
            assert [d.id for d in done] == [1, 2]
            assert done[0].timings["load"] >= 0.5 and "load" not in done[1].timings
            constructing = [f for f in frames if isinstance(f, Progress) and f.message.startswith("constructing")]
            assert {p.id for p in constructing} == {1, 2}, "the queued request hears of the load too"
            assert isinstance(first, Progress)


async def test_missing_checkpoints_are_listed_in_one_error(tmp_path: Path, voice: str) -> None:
    partial = make_checkpoints(tmp_path / "partial", skip=("bpe.model", "s2mel.pth", "feat1.pt", "qwen0.6bemo4-merge/"))
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={partial}") as peer:
            frames = await peer.request(Synthesize(id=1, text="hi", voice=voice))
            error = _error(frames)
            assert error.code == "load_failed" and error.retryable and error.detail["field"] == "model_dir"
            assert "missing bpe.model, s2mel.pth, feat1.pt, qwen0.6bemo4-merge/" in error.message
            assert str(partial) in error.message
            # Fixing the directory is enough: the next request loads.
            make_checkpoints(partial)
            assert isinstance((await peer.request(Synthesize(id=2, text="hi", voice=voice)))[-1], Done)
        assert len(peer.calls("__init__")) == 1, "the constructor never ran on the incomplete directory"


async def test_every_missing_file_of_an_empty_directory(tmp_path: Path, voice: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={empty}") as peer:
            error = _error(await peer.request(Load(id=1)))
            assert error.code == "load_failed" and error.detail["field"] == "model_dir"
            expected = [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/", *AUX_FILES]
            assert f"missing {', '.join(expected)} (" in error.message
            assert "allow_download=true" in error.message
        assert peer.calls() == [], "nothing imported or constructed"


async def test_no_indextts_installed(tmp_path: Path, ckpt: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts", f"model_dir={ckpt}", flavour=None) as peer:
            error = _error(await peer.request(Load(id=1)))
            assert error.code == "load_failed" and "IndexTTS is not installed in this interpreter" in error.message
            assert "--doctor" in error.message


# ----------------------------------------------------------------- memory


async def test_memory_in_pong_and_unload(tmp_path: Path, ckpt: Path, voice: str) -> None:
    env = {"INDEXTTS_STANDIN_CUDA": "1"}
    with anyio.fail_after(TIMEOUT):
        async with child(tmp_path, "indextts2", f"model_dir={ckpt}", torch=True, env=env) as peer:
            before = await peer.ping(1)
            assert "rss" in before.memory and "cuda_allocated" not in before.memory, "torch is not imported yet"
            assert isinstance((await peer.request(Load(id=2)))[-1], Ok)
            after = await peer.ping(3)
            assert after.memory["cuda_allocated"] == 1_234_567 and after.memory["cuda_reserved"] == 7_654_321
            assert after.memory["rss"] > 0
            unloaded = (await peer.request(Unload(id=4)))[-1]
            assert isinstance(unloaded, Ok) and unloaded.info == {"loaded": False}
            assert (await peer.ping(5)).loaded is False
            assert isinstance((await peer.request(Synthesize(id=6, text="hi", voice=voice)))[-1], Done)
        assert peer.calls("torch.cuda.empty_cache")
        assert len(peer.calls("__init__")) == 2

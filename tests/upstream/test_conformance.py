"""The adapters against the real upstream code: a spawned sidecar, the public client, tiny random models.

Each sidecar that loads a model costs 10-20 s on 2 cores (torch, transformers and
upstream's imports, then the first request's warm-up), so one test drives one sidecar
through many requests.  Sample counts are exact: with random weights the GPT never
emits its stop token, so every segment is ``max_mel_tokens * 1.72`` mel frames of 256
samples, and silences are ``interval_silence`` ms at 22050 Hz (4410 samples for 200 ms):
a count that is a multiple of 256 has no stray silence in it.

Only asyncio: these tests prove upstream conformance, and the client's behaviour on
trio is covered by the main suite (against stand-ins that now match upstream).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import HERE, ROOT, Flavour, expected_openmp, flavour_named

from indextts_client import Client, EmotionVector, InvalidRequestError, LoadFailedError, ProgressEvent

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

SEGMENT = 256  # samples per mel frame
SILENCE_200MS = 4410
#: Small enough to be quick on a CPU, large enough for several mel frames per segment.
FAST: dict[str, Any] = {"max_mel_tokens": 12, "num_beams": 1}
#: Three segments (the tiny tokenizers split "one. two. three." into one segment each at 4 tokens).
THREE = "Hello there. This is a test. We speak slowly."


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def client(
    flavour: Flavour,
    ckpt: Path,
    engine: str | None = None,
    *,
    stop: dict[str, float] | None = None,
    **engine_options: Any,
) -> Client:
    options: dict[str, Any] = {"model_dir": str(ckpt), "device": "cpu"}
    if not flavour.pypi:
        options["use_qwen_emo"] = False
    options.update(engine_options)
    return Client(
        engine or flavour.engine,
        python=flavour.python,
        engine_options=options,
        env=flavour.env(),
        ready_timeout=60,
        idle_timeout=120,
        **(stop or {}),
    )


def segment_count(events: list[ProgressEvent]) -> int:
    return sum(1 for e in events if e.stage == "synthesize" and " ready (" in e.message)


def letters(text: str) -> str:
    return "".join(character for character in text.casefold() if character.isalnum())


async def check_segment_texts(c: Client, voice: str) -> None:
    """Every chunk names its segment, announced with the words upstream's segmenter cut (its
    normalised text, no offsets into the input): one text a segment, the input's words in order."""
    async with c.stream(THREE, voice=voice, max_text_tokens_per_segment=6, **FAST) as chunks:
        got = [chunk.segment async for chunk in chunks]
    assert all(segment is not None and segment.span is None for segment in got), got
    texts = {segment.index: segment.text for segment in got if segment is not None}
    assert sorted(texts) == list(range(len(texts))) and len(texts) >= 2, texts
    assert letters(" ".join(texts.values())) == letters(THREE), texts


GITHUB = ["2", "2.5"]


@pytest.mark.parametrize("name", GITHUB)
async def test_requests_on_the_real_model(name: str, checkpoints: Any, tmp_path: Path) -> None:
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    voice, voice2 = str(ckpt / "voice.wav"), str(ckpt / "voice2.wav")
    # IndexTTS-2 through engine `indextts`, which must follow the directory: a HEAD checkout
    # holds the code of both versions.  (indextts2 loads in the PyPI test.)
    async with client(flavour, ckpt, engine="indextts" if name == "2" else None) as c:
        # Refused before the model sees them (and before it loads).
        for text in ("", "   \n", "...", "?! ,"):
            with pytest.raises(InvalidRequestError) as bad_text:
                await c.synthesize(text, voice=voice, **FAST)
            assert bad_text.value.detail.get("field") == "$.text"
        with pytest.raises(InvalidRequestError) as seed:
            await c.synthesize("Hello.", voice=voice, seed=-1, **FAST)  # greedy and seeds: test_upstream_batching.py
        assert seed.value.detail.get("field") == "$.options.seed"
        if name == "2.5":
            with pytest.raises(InvalidRequestError) as lang:
                await c.synthesize("Hello.", voice=voice, lang="zhen", **FAST)
            assert lang.value.detail.get("field") == "$.options.lang"
            with pytest.raises(InvalidRequestError) as quick:
                await c.synthesize("Hello.", voice=voice, more_segment_before=2, **FAST)
            assert quick.value.code == "unknown_option"
        assert not (await c.ping()).loaded

        info = await c.load()
        assert info["model_version"] == name
        assert info["module"] == ("indextts.infer_v2" if name == "2" else "indextts.infer_v2_5")
        # torch's OpenMP threads spin briefly before they sleep, unless the environment says otherwise.
        assert info["openmp"] == expected_openmp(), info

        # One segment: exactly upstream's samples, no trailing silence.
        events: list[ProgressEvent] = []
        audio = await c.synthesize("Hello.", voice=voice, on_progress=events.append, **FAST)
        assert audio.sample_rate == 22050
        assert len(audio.samples) > 0 and len(audio.samples) % SEGMENT == 0
        stages = [e.stage for e in events]
        first_audio = next(i for i, e in enumerate(events) if " ready (" in e.message)
        assert "prepare" in stages[:first_audio], stages
        assert all(e.stage != "prepare" for e in events[first_audio:])
        native = len(audio.samples)

        # A requested rate: a band-limited resampler (soxr, from upstream's pins), streamed.
        resampled = await c.synthesize("Hello.", voice=voice, sample_rate=16000, **FAST)
        assert resampled.sample_rate == 16000
        # The same duration: soxr ends on floor(n * 16000 / 22050) samples, torchaudio on ceil.
        assert abs(len(resampled.samples) - native * 16000 / 22050) < 1

        # Several segments: one silence between each pair, none after the last.
        events = []
        audio = await c.synthesize(THREE, voice=voice, max_text_tokens_per_segment=6, on_progress=events.append, **FAST)
        segments = segment_count(events)
        assert segments >= 2, [e.message for e in events]
        assert (len(audio.samples) - (segments - 1) * SILENCE_200MS) % SEGMENT == 0
        assert audio.samples[-SILENCE_200MS:].any()
        await check_segment_texts(c, voice)

        # interval_silence=0: upstream yields its list of segments where silence belongs.
        events = []
        audio = await c.synthesize(
            THREE, voice=voice, max_text_tokens_per_segment=6, interval_silence=0, on_progress=events.append, **FAST
        )
        assert segment_count(events) >= 2
        assert len(audio.samples) % SEGMENT == 0

        # Emotion vectors, normalised as upstream's UI does by default (a sum over 1 is fine then).
        audio = await c.synthesize("Hello.", voice=voice, emotion=EmotionVector(happy=0.9, calm=0.9), **FAST)
        assert len(audio.samples) % SEGMENT == 0
        with pytest.raises(InvalidRequestError):
            await c.synthesize(
                "Hello.", voice=voice, emotion=EmotionVector(happy=0.9, calm=0.9), normalize_emotion=False, **FAST
            )

        # Voices: a switch back hits the cache; an overwritten file is recomputed, not reused.
        before = (await c.load())["voice_cache"]
        await c.synthesize("Hello.", voice=voice2, **FAST)
        await c.synthesize("Hello.", voice=voice, **FAST)
        after = (await c.load())["voice_cache"]
        assert after["misses"] == before["misses"] + 1  # voice2 was new
        assert after["hits"] == before["hits"] + 1  # voice was cached
        copy = tmp_path / "overwritten.wav"
        shutil.copyfile(voice, copy)
        await c.synthesize("Hello.", voice=str(copy), **FAST)
        shutil.copyfile(voice2, copy)
        os.utime(copy, ns=(time.time_ns(), time.time_ns() + 10**9))
        await c.synthesize("Hello.", voice=str(copy), **FAST)
        final = (await c.load())["voice_cache"]
        assert final["misses"] == after["misses"] + 2

        # A reference that is no audio fails while preparing, named as such.
        junk = tmp_path / "junk.wav"
        junk.write_bytes(b"RIFF but not audio at all")
        with pytest.raises(Exception, match="preparing the references failed"):
            await c.synthesize("Hello.", voice=str(junk), **FAST)
        # ... and the sidecar goes on serving.
        audio = await c.synthesize("Hello.", voice=voice, **FAST)
        assert len(audio.samples) % SEGMENT == 0


@pytest.mark.parametrize("name", GITHUB)
async def test_each_request_reports_upstreams_stage_times_and_its_voice_cache(
    name: str, checkpoints: Any, caplog: pytest.LogCaptureFixture
) -> None:
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    voice, voice2 = str(ckpt / "voice.wav"), str(ckpt / "voice2.wav")
    caplog.set_level(logging.DEBUG, logger="indextts_client")
    # A stop grace far beyond the sidecar's exit, so a loaded machine cannot fail the check below.
    async with client(flavour, ckpt, stop={"shutdown_timeout": 30.0}) as c:
        first = await c.synthesize("Hello.", voice=voice, **FAST)
        # The times upstream printed after the inference, read by the adapter from its stdout.
        printed = {"gpt_gen", "s2mel", "bigvgan"} | ({"gpt_forward"} if name == "2" else set())
        assert set(first.facts["stages"]) == printed, first.facts
        assert all(seconds >= 0 for seconds in first.facts["stages"].values())
        assert first.facts["voice_cache"] == "miss"
        assert (await c.synthesize("Hello.", voice=voice2, **FAST)).facts["voice_cache"] == "miss"
        assert (await c.synthesize("Hello.", voice=voice, **FAST)).facts["voice_cache"] == "hit"
    # Closed, the sidecar ends by itself with status 0, torch and upstream loaded, through _leave's
    # exit hook.  (That it skips the teardown of the modules, which took 2 s, longer than the default
    # grace, is test_sidecar.py's test_a_finished_sidecar_skips_the_teardown_of_its_modules...)
    reaped = [r.getMessage() for r in caplog.records if "reaped" in r.getMessage()]
    assert len(reaped) == 1 and reaped[0].endswith("(returncode 0)"), reaped


async def test_the_directory_decides_the_version(checkpoints: Any) -> None:
    two, two5 = flavour_named("2"), flavour_named("2.5")
    ckpt2, ckpt25 = checkpoints(two), checkpoints(two5)
    # A version the engine does not run is refused before anything heavy is imported.
    for flavour, ckpt, other in ((two, ckpt25, "indextts2.5"), (two5, ckpt2, "indextts2")):
        async with client(flavour, ckpt) as c:
            started = time.monotonic()
            with pytest.raises(LoadFailedError) as refused:
                await c.load()
            assert f"--engine {other}" in str(refused.value)
            assert time.monotonic() - started < 30
        assert not (ckpt / "hf_cache" / "._____temp").exists()


@pytest.mark.parametrize("name", GITHUB)
async def test_a_missing_auxiliary_model_is_named_and_nothing_is_downloaded(
    name: str, checkpoints: Any, tmp_path: Path
) -> None:
    flavour = flavour_named(name)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints(flavour), ckpt)
    (ckpt / "hf_cache" / "campplus_cn_common.bin").unlink()
    shutil.rmtree(ckpt / "hf_cache" / "bigvgan")
    if name == "2.5":
        (ckpt / "codec.pth").unlink()
    async with client(flavour, ckpt) as c:
        with pytest.raises(LoadFailedError) as missing:
            await c.load()
    message = str(missing.value)
    if name == "2.5":
        assert "missing codec.pth, hf_cache/" in message and "bpe.model" not in message
    assert "hf_cache/campplus_cn_common.bin" in message
    assert "hf_cache/bigvgan/config.json" in message
    assert "allow_download" in message
    left = {p.name for p in (ckpt / "hf_cache").iterdir()}
    assert left == ({"w2v-bert-2.0", "semantic_codec_model.safetensors"} if name == "2" else {"w2v-bert-2.0"})


def test_upstream_still_has_what_the_adapter_relies_on() -> None:
    """Names and formulas read from upstream: this fails loudly when upstream renames them."""
    flavour = flavour_named("2")
    script = HERE / "probe_upstream.py"
    done = subprocess.run(
        [flavour.python, str(script)],
        env={**os.environ, **flavour.env()},
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok"), done.stdout


@pytest.mark.parametrize("name", ["pypi2", "pypi2.5"])
async def test_the_pypi_repackagings(name: str, checkpoints: Any) -> None:
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    voice = str(ckpt / "voice.wav")
    extra = {"HF_HOME": str(ckpt / "hf_home")} if name == "pypi2" else {}
    options: dict[str, Any] = {"model_dir": str(ckpt), "device": "cpu"}
    async with Client(
        flavour.engine,
        python=flavour.python,
        engine_options=options,
        env=flavour.env(**extra),
        ready_timeout=60,
        idle_timeout=120,
    ) as c:
        info = await c.load()
        expected = ("indextts.infer_v2", "2") if name == "pypi2" else ("indextts25.infer_v2_5", "2.5")
        assert (info["module"], info["model_version"]) == expected
        assert "from indextts2" in info["flavour"]
        # The package's __init__ imports torch: the flavour is found without it, so the spinning
        # of torch's OpenMP threads is bounded before torch loads (it slowed this test 6x or more
        # on a busy 2-core machine when it was not).
        assert info["openmp"] == expected_openmp(), info
        events: list[ProgressEvent] = []
        audio = await c.synthesize("Hello.", voice=voice, on_progress=events.append, **FAST)
        assert len(audio.samples) > 0 and len(audio.samples) % SEGMENT == 0
        # Every segment arrives, not only the first (indextts25's infer() returns one).
        events = []
        audio = await c.synthesize(THREE, voice=voice, max_text_tokens_per_segment=6, on_progress=events.append, **FAST)
        segments = segment_count(events)
        assert segments >= 2, [e.message for e in events]
        assert (len(audio.samples) - (segments - 1) * SILENCE_200MS) % SEGMENT == 0
        # The PCM scale is right: random weights are loud, never near-silent after scaling.
        assert int(abs(audio.samples.astype("int32")).max()) > 1000
        await check_segment_texts(c, voice)
        with pytest.raises(InvalidRequestError):
            await c.synthesize("...", voice=voice, **FAST)


async def test_indextts2_inference_always_needs_the_qwen_folder(checkpoints: Any, tmp_path: Path) -> None:
    """2.1.1 loads Qwen whatever use_qwen_emo says: the adapter requires the folder, by name."""
    flavour = flavour_named("pypi2")
    ckpt = checkpoints(flavour)
    bare = tmp_path / "ckpt"
    bare.mkdir()
    for entry in ckpt.iterdir():
        if entry.name != "qwen0.6bemo4-merge":
            (bare / entry.name).symlink_to(entry)
    options = {"model_dir": str(bare), "device": "cpu", "use_qwen_emo": False}
    env = flavour.env(HF_HOME=str(ckpt / "hf_home"))
    async with Client(flavour.engine, python=flavour.python, engine_options=options, env=env, ready_timeout=60) as c:
        with pytest.raises(LoadFailedError) as missing:
            await c.load()
    assert "missing qwen0.6bemo4-merge/" in str(missing.value)
    assert "the PyPI package always loads it" in str(missing.value)

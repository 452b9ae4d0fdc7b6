"""The IndexTTS adapter called in-process against the stand-in packages in tests/standin.

The wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
import subprocess
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from harness import REPO, STANDIN, make_checkpoints

from indextts_sidecar.engines import Cancelled, EngineError, LoadError, RequestError, SynthesisRequest, engine_class
from indextts_sidecar.engines import indextts as adapter
from indextts_sidecar.engines.indextts import (
    AUX_FILES,
    AUX_FILES_25,
    CHECKPOINT_FILES,
    CHECKPOINT_FILES_25,
    IndexTTS2Engine,
    IndexTTS2Options,
    IndexTTS2RequestOptions,
    IndexTTS25Engine,
    IndexTTS25Options,
    IndexTTS25RequestOptions,
    IndexTTSAuto,
    IndexTTSAutoOptions,
    find_flavour,
    missing_checkpoints,
    to_pcm16,
)
from indextts_sidecar.protocol import Emotion, EmotionAudio, EmotionText, EmotionVector
from indextts_sidecar.protocol.options import parse_options

ALL_ENTRIES = [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/"]
ALL_ENTRIES_25 = [*CHECKPOINT_FILES_25, "qwen0.6bemo4-merge/"]


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[dict[str, Any]]]:
    """The stand-in's call log, as a function returning the entries so far."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("INDEXTTS_STANDIN_LOG", str(log))

    def read() -> list[dict[str, Any]]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return read


@pytest.fixture
def ckpt25(tmp_path: Path) -> Path:
    """A complete stand-in IndexTTS-2.5 checkpoint folder."""
    return make_checkpoints(tmp_path / "checkpoints-2.5", version="2.5")


def _aux_paths(ckpt: Path) -> dict[str, str]:
    """Upstream's aux_paths for the auxiliary models in <ckpt>/hf_cache."""
    cache = ckpt / "hf_cache"
    return {
        "w2v_bert": str(cache / "w2v-bert-2.0"),
        "semantic_codec": str(cache / "semantic_codec_model.safetensors"),
        "campplus": str(cache / "campplus_cn_common.bin"),
        "bigvgan": str(cache / "bigvgan"),
    }


def _forget_indextts() -> None:
    for name in list(sys.modules):
        if name == "indextts" or name.startswith("indextts."):
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Put one stand-in flavour (v2, v25, pypi) on sys.path for this test only."""
    _forget_indextts()

    def use(flavour: str) -> None:
        monkeypatch.syspath_prepend(str(STANDIN / flavour))
        importlib.invalidate_caches()

    yield use
    _forget_indextts()


def _progress(*args: Any) -> None:
    pass


def _never() -> bool:
    return False


def _engine(cls: type[Any], **options: Any) -> Any:
    return cls(msgspec.convert(options, cls.Options))


def _request(
    cls: type[Any], voice: str | None, text: str = "one two three", emotion: Emotion | None = None, **options: Any
) -> SynthesisRequest[Any]:
    return SynthesisRequest(
        id=1, text=text, voice=voice, emotion=emotion, options=msgspec.convert(options, cls.RequestOptions)
    )


def _infer_calls(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["event"] == "infer"]


# ----------------------------------------------------------------- import and registry


def test_module_imports_only_stdlib_and_msgspec() -> None:
    code = (
        "import sys; import indextts_sidecar.engines.indextts; "
        "heavy = {'numpy', 'torch', 'indextts', 'anyio', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_engines_are_registered_with_the_native_rate() -> None:
    assert engine_class("indextts2") is IndexTTS2Engine
    assert engine_class("indextts2.5") is IndexTTS25Engine
    assert engine_class("indextts") is IndexTTSAuto
    for cls in (IndexTTS2Engine, IndexTTS25Engine, IndexTTSAuto):
        engine = _engine(cls)
        assert engine.sample_rate == cls.native_sample_rate == 22050
        assert not engine.loaded
        assert "streaming" in cls.capabilities


# ----------------------------------------------------------------- audio conversion


def test_int16_round_trips_exactly_through_both_float_scales() -> None:
    every = np.arange(-32768, 32768, dtype=np.int16)
    pcm_scale = every.astype(np.float32).reshape(1, -1)  # upstream: (1, n) on PCM scale
    unit_scale = every.astype(np.float32) / np.float32(32768)  # the PyPI repackaging: [-1, 1]
    assert np.array_equal(to_pcm16(pcm_scale, unit_scale=False), every)
    assert np.array_equal(to_pcm16(unit_scale, unit_scale=True), every)
    assert np.array_equal(to_pcm16(every.astype(np.float64).reshape(-1, 1), unit_scale=False), every)
    # The seed multiplied by 32767 and truncated: every sample came back 1 LSB closer to zero.
    assert to_pcm16(np.array([1.0, -1.0, 0.5]), unit_scale=True).tolist() == [32767, -32768, 16384]


def test_rounding_and_clipping() -> None:
    raw = np.array([0.4, 0.6, -0.6, 1.5, 2.5, 40000.0, -40000.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    assert to_pcm16(raw, unit_scale=False).tolist() == [0, 1, -1, 2, 2, 32767, -32768, 0, 32767, -32768]
    assert to_pcm16(np.array([2.0, -2.0]), unit_scale=True).tolist() == [32767, -32768]


def test_conversion_accepts_tensors_and_int16() -> None:
    class Tensor:
        def __init__(self, array: np.ndarray, bf16: bool = False) -> None:
            self.array, self.bf16 = array, bf16

        def detach(self) -> Tensor:
            return self

        def cpu(self) -> Tensor:
            return self

        def float(self) -> Tensor:
            return Tensor(self.array.astype(np.float32))

        def numpy(self) -> np.ndarray:
            if self.bf16:
                raise TypeError("Got unsupported ScalarType BFloat16")
            return self.array

    samples = np.array([[100.0, -200.0, 300.0]])
    assert to_pcm16(Tensor(samples), unit_scale=False).tolist() == [100, -200, 300]
    assert to_pcm16(Tensor(samples, bf16=True), unit_scale=False).tolist() == [100, -200, 300]
    native = np.array([[5], [-32768], [32767]], dtype=np.int16)  # the non-streaming (N, 1) return
    out = to_pcm16(native, unit_scale=True)  # int16 is never rescaled
    assert out.tolist() == [5, -32768, 32767] and out.dtype == np.dtype("<i2") and out.flags.c_contiguous
    with pytest.raises(EngineError, match="not mono"):
        to_pcm16(np.zeros((2, 10), dtype=np.float32), unit_scale=False)


# ----------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": 0}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"num_beams": 0}, "num_beams"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"max_mel_tokens": 0}, "max_mel_tokens"),
        ({"interval_silence": -1}, "interval_silence"),
        ({"max_text_tokens_per_segment": 0}, "max_text_tokens_per_segment"),
        ({"more_segment_before": -1}, "more_segment_before"),
        ({"quick_streaming_tokens": -1}, "quick_streaming_tokens"),
        ({"do_sample": "yes"}, "do_sample"),
        ({"lang": "fr"}, "lang"),
        ({"lang": "zhen"}, "lang"),  # not a language token of upstream's tokenizer
        ({"duration_factor": 0.49}, "duration_factor"),
        ({"duration_factor": 2.01}, "duration_factor"),
        ({"emo_vector": [0] * 8}, "emo_vector"),
        ({"stream_return": False}, "stream_return"),
    ],
)
def test_request_options_reject_bad_values_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.convert(options, IndexTTS25RequestOptions)


def test_length_penalty_must_be_finite() -> None:
    with pytest.raises(msgspec.ValidationError, match="length_penalty"):
        msgspec.convert({"length_penalty": float("nan")}, IndexTTS2RequestOptions)
    assert msgspec.convert({"length_penalty": -1.5}, IndexTTS2RequestOptions).length_penalty == -1.5


@pytest.mark.parametrize("name", ["lang", "duration_factor", "text_normalization"])
def test_25_only_request_options_are_unknown_to_indextts2(name: str) -> None:
    value = {"lang": "en", "duration_factor": 1.0, "text_normalization": False}[name]
    with pytest.raises(msgspec.ValidationError, match=f"unknown field `{name}`"):
        msgspec.convert({name: value}, IndexTTS2RequestOptions)
    msgspec.convert({name: value}, IndexTTS25RequestOptions)


def test_lang_is_case_insensitive() -> None:
    for lang in ("zh", "EN", "Ja", "es", "AR"):
        assert msgspec.convert({"lang": lang}, IndexTTS25RequestOptions).lang == lang


def test_engine_options_from_the_command_line() -> None:
    parsed = parse_options(["model_dir=/m", "fp16=true", "device=cuda:1", "use-cuda-kernel=false"])
    opts = msgspec.convert(parsed, IndexTTS2Options, strict=False)
    assert (opts.model_dir, opts.fp16, opts.device, opts.use_cuda_kernel) == ("/m", True, "cuda:1", False)
    with pytest.raises(msgspec.ValidationError, match="bf16"):
        msgspec.convert({"bf16": True}, IndexTTS2Options, strict=False)
    with pytest.raises(msgspec.ValidationError, match="fp16"):
        msgspec.convert({"fp16": True}, IndexTTS25Options, strict=False)
    with pytest.raises(msgspec.ValidationError, match="lang"):
        msgspec.convert({"lang": "klingon"}, IndexTTS25Options, strict=False)
    auto = msgspec.convert({"fp16": True, "bf16": True, "lang": "zh"}, IndexTTSAutoOptions, strict=False)
    assert (auto.fp16, auto.bf16, auto.lang) == (True, True, "zh")
    assert IndexTTS25Options().lang == "en"


# ----------------------------------------------------------------- check()


def _check_error(engine: Any, request: SynthesisRequest[Any]) -> str:
    with pytest.raises(RequestError) as info:
        engine.check(request)
    assert info.value.code == "invalid_input"
    return str(info.value.field)


def test_check_rejects_bad_text_and_voice(tmp_path: Path, voice: str) -> None:
    engine = _engine(IndexTTS2Engine)
    cls = IndexTTS2Engine
    assert _check_error(engine, _request(cls, voice, text=" \n ")) == "$.text"
    # Nothing to speak: upstream 2.5 would voice the language tag alone.
    for text in ("...", "?! ,", "\u3002\uff01"):
        assert _check_error(engine, _request(cls, voice, text=text)) == "$.text"
    engine.check(_request(cls, voice, text="1."))
    engine.check(_request(cls, voice, text="\u4f60\u597d\u3002"))
    assert _check_error(engine, _request(cls, None)) == "$.voice"
    assert _check_error(engine, _request(cls, "")) == "$.voice"
    assert _check_error(engine, _request(cls, str(tmp_path / "nope.wav"))) == "$.voice"
    assert _check_error(engine, _request(cls, str(tmp_path))) == "$.voice"
    engine.check(_request(cls, voice))


def test_check_rejects_an_unreadable_voice(voice: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Permission bits cannot make a file unreadable for root (CI runs as root): ask os.access.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != voice and real_access(path, mode))
    assert _check_error(_engine(IndexTTS2Engine), _request(IndexTTS2Engine, voice)) == "$.voice"


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
    engine = _engine(IndexTTS2Engine)
    assert _check_error(engine, _request(IndexTTS2Engine, voice, emotion=emotion)) == field


@pytest.mark.parametrize("alpha", [-0.1, 1.01])
def test_emotion_audio_alpha_must_be_in_range(alpha: float, voice: str) -> None:
    request = _request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=voice, alpha=alpha))
    assert _check_error(_engine(IndexTTS2Engine), request) == "$.emotion.alpha"


def test_check_accepts_good_emotions(voice: str) -> None:
    engine = _engine(IndexTTS2Engine)
    for emotion in (
        EmotionVector(happy=0.3, sad=0.3, calm=0.4),  # sums to exactly 1
        EmotionVector(surprised=1.0, alpha=3.0),  # alpha is clamped, as upstream does
        EmotionVector(),
        EmotionAudio(path=voice, alpha=0.0),
        EmotionText(text=None),
    ):
        engine.check(_request(IndexTTS2Engine, voice, emotion=emotion))


def test_do_sample_is_refused_as_upstream_ignores_it(voice: str) -> None:
    for value in (True, False):
        with pytest.raises(RequestError) as info:
            _engine(IndexTTS2Engine).check(_request(IndexTTS2Engine, voice, do_sample=value))
        assert (info.value.code, info.value.field) == ("unknown_option", "$.options.do_sample")


def test_an_emotion_sum_over_1_needs_normalisation(voice: str) -> None:
    over = EmotionVector(happy=0.6, angry=0.5)
    _engine(IndexTTS2Engine).check(_request(IndexTTS2Engine, voice, emotion=over))  # normalised by default
    strict = _request(IndexTTS2Engine, voice, emotion=over, normalize_emotion=False)
    assert _check_error(_engine(IndexTTS2Engine), strict) == "$.emotion"
    off = _engine(IndexTTS2Engine, normalize_emotion=False)
    assert _check_error(off, _request(IndexTTS2Engine, voice, emotion=over)) == "$.emotion"
    off.check(_request(IndexTTS2Engine, voice, emotion=over, normalize_emotion=True))
    # The range of each weight is checked either way.
    assert _check_error(_engine(IndexTTS2Engine), _request(IndexTTS2Engine, voice, emotion=EmotionVector(sad=1.5)))


def test_emotion_weights_follow_upstreams_ui() -> None:
    # Upstream's normalize_emo_vec: a bias per emotion, then the sum capped at 0.8.
    upstream_bias = [0.9375, 0.875, 1.0, 1.0, 0.9375, 0.9375, 0.6875, 0.5625]
    capped = [b * 0.8 / sum(upstream_bias) for b in upstream_bias]
    assert adapter.emotion_weights([1.0] * 8, normalize=True) == pytest.approx(capped)
    assert math.fsum(adapter.emotion_weights([1.0] * 8, normalize=True)) == pytest.approx(0.8)
    assert adapter.emotion_weights([0.0] * 7 + [0.5], normalize=True) == [0.0] * 7 + [0.28125]
    assert adapter.emotion_weights([0.2] * 8, normalize=False) == [0.2] * 8


def test_emotion_text_needs_the_qwen_model(voice: str) -> None:
    text = EmotionText(text="furious")
    # 2.5 runs without Qwen by default: refused before upstream's RuntimeError.
    assert _check_error(_engine(IndexTTS25Engine), _request(IndexTTS25Engine, voice, emotion=text)) == "$.emotion"
    _engine(IndexTTS25Engine, use_qwen_emo=True).check(_request(IndexTTS25Engine, voice, emotion=text))
    _engine(IndexTTS2Engine).check(_request(IndexTTS2Engine, voice, emotion=text))
    off = _engine(IndexTTS2Engine, use_qwen_emo=False)
    assert _check_error(off, _request(IndexTTS2Engine, voice, emotion=text)) == "$.emotion"
    # Auto does not know its flavour before loading: the check waits for the load.
    _engine(IndexTTSAuto).check(_request(IndexTTSAuto, voice, emotion=text))
    off_auto = _engine(IndexTTSAuto, use_qwen_emo=False)
    assert _check_error(off_auto, _request(IndexTTSAuto, voice, emotion=text)) == "$.emotion"


# ----------------------------------------------------------------- checkpoints and flavours


def test_missing_checkpoints_lists_every_entry(tmp_path: Path) -> None:
    assert missing_checkpoints(str(tmp_path / "absent")) == ALL_ENTRIES
    assert missing_checkpoints(str(tmp_path / "absent"), qwen_emo=False) == list(CHECKPOINT_FILES)
    assert missing_checkpoints(str(tmp_path / "absent"), version="2.5") == ALL_ENTRIES_25
    assert missing_checkpoints(str(tmp_path / "absent"), qwen_emo=False, aux=True) == [*CHECKPOINT_FILES, *AUX_FILES]
    partial = make_checkpoints(tmp_path / "partial", skip=("gpt.pth", "feat2.pt", "qwen0.6bemo4-merge/"))
    assert missing_checkpoints(str(partial)) == ["gpt.pth", "feat2.pt", "qwen0.6bemo4-merge/"]
    cfg = str(tmp_path / "elsewhere.yaml")
    assert missing_checkpoints(str(partial), cfg_path=cfg, qwen_emo=False) == [cfg, "gpt.pth", "feat2.pt"]
    # 2.5 reads codec.pth and its tiktoken tokenizer, never bpe.model nor MaskGCT's codec.
    two5 = make_checkpoints(tmp_path / "two5", version="2.5", skip=("codec.pth", "hf_cache/bigvgan/config.json"))
    assert not (two5 / "bpe.model").exists() and not (two5 / "hf_cache/semantic_codec_model.safetensors").exists()
    assert missing_checkpoints(str(two5), version="2.5", aux=True) == ["codec.pth", "hf_cache/bigvgan/config.json"]
    assert missing_checkpoints(str(two5), version="2", qwen_emo=False) == ["bpe.model"]


def test_the_checkpoint_directory_decides_the_version(tmp_path: Path) -> None:
    assert adapter.checkpoint_version(str(make_checkpoints(tmp_path / "a"))) == "2"
    assert adapter.checkpoint_version(str(make_checkpoints(tmp_path / "b", version="2.5"))) == "2.5"
    assert adapter.checkpoint_version(str(tmp_path / "absent")) is None
    # Without a version line, the files only one version has decide.
    for name, version in (("codec.pth", "2.5"), (adapter.TIKTOKEN_FILE, "2.5"), ("bpe.model", "2")):
        folder = tmp_path / f"files-{name}"
        folder.mkdir()
        (folder / "config.yaml").write_text("gpt:\n  layers: 1\n")
        (folder / name).write_bytes(b"stand-in")
        assert adapter.checkpoint_version(str(folder)) == version
    # The version line wins over the files, and cfg_path replaces <model_dir>/config.yaml.
    mixed = make_checkpoints(tmp_path / "mixed")
    (mixed / "codec.pth").write_bytes(b"stand-in")
    assert adapter.checkpoint_version(str(mixed)) == "2"
    cfg = tmp_path / "v25.yaml"
    cfg.write_text('version: "2.5"  # quoted, with a comment\n')
    assert adapter.checkpoint_version(str(mixed), str(cfg)) == "2.5"


@pytest.mark.parametrize(
    ("cls", "options", "expect"),
    [
        (IndexTTS2Engine, {}, [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/", *AUX_FILES]),
        (IndexTTS2Engine, {"use_qwen_emo": False}, [*CHECKPOINT_FILES, *AUX_FILES]),
        (IndexTTS2Engine, {"use_qwen_emo": False, "allow_download": True}, list(CHECKPOINT_FILES)),
        (IndexTTS25Engine, {}, [*CHECKPOINT_FILES_25, *AUX_FILES_25]),
        (IndexTTS25Engine, {"use_qwen_emo": True}, [*CHECKPOINT_FILES_25, "qwen0.6bemo4-merge/", *AUX_FILES_25]),
        (IndexTTSAuto, {}, [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/", *AUX_FILES]),
    ],
)
def test_load_reports_every_missing_file_before_importing(
    cls: type[Any], options: dict[str, Any], expect: list[str], tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v25")
    empty = tmp_path / "empty"
    empty.mkdir()
    engine = _engine(cls, model_dir=str(empty), **options)
    with pytest.raises(LoadError) as info:
        engine.load(_progress, _never)
    message = str(info.value)
    assert f"missing {', '.join(expect)}" in message, message
    assert ("allow_download=true" in message) == any(name.startswith("hf_cache/") for name in expect)
    assert str(empty) in message and "is incomplete" in message
    assert info.value.code == "load_failed" and info.value.retryable and info.value.field == "model_dir"
    assert "indextts.infer_v2" not in sys.modules, "checkpoints are checked before the import"
    assert "indextts.infer_v2_5" not in sys.modules
    with pytest.raises(LoadError, match="does not exist"):
        _engine(cls, model_dir=str(tmp_path / "nowhere")).load(_progress, _never)


def test_a_missing_qwen_folder_is_reported_with_the_rest(tmp_path: Path, standin: Callable[[str], None]) -> None:
    standin("v2")
    partial = make_checkpoints(
        tmp_path / "partial", skip=("feat1.pt", "qwen0.6bemo4-merge/", "hf_cache/bigvgan/config.json")
    )
    with pytest.raises(LoadError) as info:
        _engine(IndexTTS2Engine, model_dir=str(partial)).load(_progress, _never)
    assert "missing feat1.pt, qwen0.6bemo4-merge/, hf_cache/bigvgan/config.json (" in str(info.value)
    assert "use_qwen_emo is on" in str(info.value)
    assert "indextts.infer_v2" not in sys.modules


def test_a_version_the_engine_does_not_run_names_the_other_engine(
    tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v25")  # a checkout holds the code of both versions: the directory decides
    ckpt2, ckpt25 = make_checkpoints(tmp_path / "two"), make_checkpoints(tmp_path / "two5", version="2.5")
    for cls, ckpt, version, other in (
        (IndexTTS25Engine, ckpt2, "2", "indextts2"),
        (IndexTTS2Engine, ckpt25, "2.5", "indextts2.5"),
    ):
        with pytest.raises(LoadError) as info:
            _engine(cls, model_dir=str(ckpt)).load(_progress, _never)
        assert (info.value.code, info.value.field) == ("load_failed", "model_dir")
        assert f"holds an IndexTTS-{version} model" in str(info.value)
        assert f"--engine {other}" in str(info.value) and "--engine indextts" in str(info.value)
    assert "indextts.infer_v2" not in sys.modules and "indextts.infer_v2_5" not in sys.modules


def test_auto_follows_the_directory(
    tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    two = _loaded(IndexTTSAuto, make_checkpoints(tmp_path / "two"))
    two5 = _loaded(IndexTTSAuto, make_checkpoints(tmp_path / "two5", version="2.5"))
    assert (two.flavour.kind, two.flavour.module) == ("2", "indextts.infer_v2")
    assert (two5.flavour.kind, two5.flavour.module) == ("2.5", "indextts.infer_v2_5")
    assert two.info()["model_version"] == "2" and two5.info()["model_version"] == "2.5"
    assert [c["module"] for c in calls() if c["event"] == "__init__"] == ["indextts.infer_v2", "indextts.infer_v2_5"]


def test_load_without_indextts_says_how_to_install(ckpt: Path, standin: Callable[[str], None]) -> None:
    with pytest.raises(LoadError, match="IndexTTS is not installed in this interpreter") as info:
        _engine(IndexTTSAuto, model_dir=str(ckpt)).load(_progress, _never)
    assert sys.executable in str(info.value) and "--doctor" in str(info.value)


def test_a_25_directory_on_a_2_install_says_what_is_missing(tmp_path: Path, standin: Callable[[str], None]) -> None:
    standin("v2")
    ckpt25 = make_checkpoints(tmp_path / "two5", version="2.5")
    for cls in (IndexTTS25Engine, IndexTTSAuto):
        with pytest.raises(LoadError) as info:
            _engine(cls, model_dir=str(ckpt25)).load(_progress, _never)
        message = str(info.value)
        assert (
            "holds an IndexTTS-2.5 model, and no indextts.infer_v2_5 or indextts25.infer_v2_5 is installed" in message
        )
        assert "(it has IndexTTS-2, which cannot run this checkpoint)" in message


@pytest.mark.parametrize(
    ("flavour", "prefer", "kind", "module"),
    [
        ("v2", ("2.5", "2"), "2", "indextts.infer_v2"),
        ("v25", ("2.5", "2"), "2.5", "indextts.infer_v2_5"),
        ("v25", ("2",), "2", "indextts.infer_v2"),
        ("pypi", ("2.5", "2"), "pypi", "indextts.infer_v2"),
    ],
)
def test_find_flavour(
    flavour: str, prefer: tuple[str, ...], kind: str, module: str, standin: Callable[[str], None]
) -> None:
    assert find_flavour() is None
    standin(flavour)
    found = find_flavour(prefer)
    assert found is not None and (found.kind, found.module) == (kind, module)
    assert found.location == str(STANDIN / flavour / "indextts")
    assert "indextts.infer_v2" not in sys.modules and "indextts.infer_v2_5" not in sys.modules


# ----------------------------------------------------------------- load


def test_load_reports_each_step_and_heartbeats_while_constructing(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    gate = tmp_path / "construct-gate"
    monkeypatch.setenv("INDEXTTS_STANDIN_CONSTRUCT_GATE", str(gate))
    monkeypatch.setattr(adapter._adapter, "HEARTBEAT_INTERVAL", 0.01)
    events: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def progress(*args: Any) -> None:
        with lock:
            events.append(args)
            # The constructor blocks until three heartbeats have arrived.
            if sum(1 for e in events if e[1] == 0.3) >= 4:
                gate.touch()

    engine = _engine(IndexTTS2Engine, model_dir=str(ckpt))
    engine.load(progress, _never)
    assert engine.loaded and engine.flavour.kind == "2"
    fractions = [e[1] for e in events]
    assert fractions[:3] == [0.0, 0.1, 0.3] and fractions[-1] == 1.0
    assert fractions.count(0.3) >= 4, "heartbeats during the construct step"
    assert all(e[0] == "load" for e in events)
    assert "IndexTTS-2" in events[-1][2]


def test_load_cancelled_between_steps(ckpt: Path, standin: Callable[[str], None]) -> None:
    standin("v2")
    engine = _engine(IndexTTS2Engine, model_dir=str(ckpt))
    with pytest.raises(Cancelled):
        engine.load(_progress, lambda: True)
    assert not engine.loaded


def test_constructor_gets_keywords_only_mapped_from_options(
    ckpt: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = _engine(
        IndexTTS2Engine,
        model_dir=str(ckpt),
        device="cpu",
        fp16=True,
        use_cuda_kernel=False,
        use_deepspeed=True,
        use_accel=True,
        use_torch_compile=True,
        use_qwen_emo=False,
    )
    engine.load(_progress, _never)
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    assert init["args"] == []
    assert init["kwargs"] == {
        "model_dir": str(ckpt),
        "cfg_path": str(ckpt / "config.yaml"),
        "device": "cpu",
        "use_fp16": True,
        "use_cuda_kernel": False,
        "use_deepspeed": True,
        "use_accel": True,
        "use_torch_compile": True,
        "use_qwen_emo": False,
        "aux_paths": _aux_paths(ckpt),
    }
    assert engine.dropped_options == []


def test_auxiliary_models_stay_offline_unless_downloads_are_allowed(
    ckpt: Path,
    tmp_path: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    standin("v2")
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    _engine(IndexTTS2Engine, model_dir=str(ckpt)).load(_progress, _never)
    bare = make_checkpoints(tmp_path / "bare", hf_cache=False)
    with pytest.raises(LoadError, match="allow_download=true"):
        _engine(IndexTTS2Engine, model_dir=str(bare)).load(_progress, _never)
    # With downloads allowed upstream gets no aux_paths and fetches what is missing (the
    # stand-in, without network, fails there), and the Hugging Face libraries are left online.
    with pytest.raises(RuntimeError, match=r"would download w2v-bert-2\.0/"):
        _engine(IndexTTS2Engine, model_dir=str(bare), allow_download=True).load(_progress, _never)
    inits = [c for c in calls() if c["event"] == "__init__"]
    assert [init["kwargs"].get("aux_paths") for init in inits] == [_aux_paths(ckpt), None]
    (constructed,) = [c for c in calls() if c["event"] == "constructed"]
    assert constructed["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    (download,) = [c for c in calls() if c["event"] == "download"]
    assert download["env"] == {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}
    assert not any(name in os.environ for name in names), "restored after construction"


def test_unset_options_keep_upstream_defaults(
    ckpt25: Path, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    cfg = tmp_path / "config_v2_5.yaml"
    cfg.write_text("version: 2.5\n")
    _engine(IndexTTS25Engine, model_dir=str(ckpt25), cfg_path=str(cfg), bf16=True).load(_progress, _never)
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    # Upstream 2.5 has no aux_paths: it reads <model_dir>/hf_cache itself.
    assert init["kwargs"] == {"model_dir": str(ckpt25), "cfg_path": str(cfg), "use_bf16": True}


def test_the_other_25_constructor_signature(
    ckpt25: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One upstream commit defaults cfg_path to configs/config_v2_5.yaml and adds use_gpt_latent.
    monkeypatch.setenv("INDEXTTS_STANDIN_V25_VARIANT", "gpt_latent")
    standin("v25")
    _engine(IndexTTS25Engine, model_dir=str(ckpt25), use_cuda_kernel=True).load(_progress, _never)
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    assert init["args"] == []
    expected = {"model_dir": str(ckpt25), "cfg_path": str(ckpt25 / "config.yaml"), "use_cuda_kernel": True}
    assert init["kwargs"] == expected


@pytest.mark.parametrize(
    ("flavour", "version", "cls", "options", "dropped", "passed"),
    [
        # indextts2-inference 2.1.1 has use_accel but no use_qwen_emo (it always loads the model).
        (
            "pypi",
            "2",
            IndexTTS2Engine,
            {"use_accel": True, "use_qwen_emo": False, "fp16": True},
            ["use_qwen_emo"],
            {"use_fp16": True, "use_accel": True},
        ),
        ("v25", "2.5", IndexTTSAuto, {"fp16": True, "bf16": True}, ["fp16"], {"use_bf16": True}),
        ("v2", "2", IndexTTSAuto, {"fp16": True, "bf16": False, "lang": "zh"}, ["bf16", "lang"], {"use_fp16": True}),
        # Upstream turns fp16 off on MPS only when it picks the device itself.
        ("v2", "2", IndexTTS2Engine, {"device": "mps", "fp16": True}, ["fp16"], {"device": "mps"}),
    ],
)
def test_options_the_installed_constructor_lacks_are_dropped(
    flavour: str,
    version: str,
    cls: type[Any],
    options: dict[str, Any],
    dropped: list[str],
    passed: dict[str, Any],
    tmp_path: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    standin(flavour)
    ckpt = make_checkpoints(tmp_path / "ckpt", version=version)
    engine = _engine(cls, model_dir=str(ckpt), **options)
    engine.load(_progress, _never)
    assert engine.dropped_options == dropped
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    assert init["args"] == []
    if flavour == "v2":
        passed = {**passed, "aux_paths": _aux_paths(ckpt)}
    assert init["kwargs"] == {"model_dir": str(ckpt), "cfg_path": str(ckpt / "config.yaml"), **passed}
    for name in dropped:
        assert any(name in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    # A reload starts from a clean list.
    engine.unload()
    engine.load(_progress, _never)
    assert engine.dropped_options == dropped


def test_importing_upstream_leaves_the_process_as_it_was(
    ckpt25: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Upstream's modules install warning filters and (2.5) point HF_HUB_CACHE at ./checkpoints.
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    standin("v25")
    filters = list(warnings.filters)
    _loaded(IndexTTS25Engine, ckpt25)
    (imported,) = [c for c in calls() if c["event"] == "imported"]
    assert imported["module"] == "indextts.infer_v2_5" and imported["hf_hub_cache"] == "./checkpoints/hf_cache"
    assert "HF_HUB_CACHE" not in os.environ
    assert warnings.filters == filters


def test_a_failed_construct_leaves_the_engine_unloaded_and_retryable(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    monkeypatch.setenv("INDEXTTS_STANDIN_FAIL_CONSTRUCTS", "1")
    monkeypatch.setenv("INDEXTTS_STANDIN_COUNTER", str(tmp_path / "count"))
    engine = _engine(IndexTTS2Engine, model_dir=str(ckpt))
    with pytest.raises(RuntimeError, match="injected construct failure 1 of 1"):
        engine.load(_progress, _never)
    assert not engine.loaded
    engine.load(_progress, _never)
    assert engine.loaded


# ----------------------------------------------------------------- synthesize


def _loaded(cls: type[Any], ckpt: Path, **options: Any) -> Any:
    engine = _engine(cls, model_dir=str(ckpt), **options)
    engine.load(_progress, _never)
    return engine


def _speak(engine: Any, request: SynthesisRequest[Any], cancelled: Callable[[], bool] = _never) -> list[np.ndarray]:
    engine.check(request)
    return [
        np.frombuffer(memoryview(c).cast("B"), dtype="<i2").copy()
        for c in engine.synthesize(request, _progress, cancelled)
    ]


def test_streams_segments_with_silence_between_them_only(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt)
    events: list[tuple[Any, ...]] = []
    request = _request(IndexTTS2Engine, voice, text="a b c d e", max_text_tokens_per_segment=2, interval_silence=100)
    chunks = [bytes(c) for c in engine.synthesize(request, lambda *a: events.append(a), _never)]
    sizes = [len(c) // 2 for c in chunks]
    # 0.1 s per word; upstream's 100 ms silence after the last segment is dropped.
    assert sizes == [4410, 2205, 4410, 2205, 2205]
    assert chunks[1] == chunks[3] == bytes(4410)
    assert all(np.frombuffer(chunks[i], dtype="<i2").any() for i in (0, 2, 4))
    (infer,) = _infer_calls(calls())
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
    engine = _loaded(IndexTTS2Engine, ckpt)
    events: list[tuple[Any, ...]] = []
    request = _request(IndexTTS2Engine, voice, text="a b c d e", max_text_tokens_per_segment=2, interval_silence=0)
    chunks = list(engine.synthesize(request, lambda *a: events.append(a), _never))
    assert [len(bytes(c)) // 2 for c in chunks] == [4410, 4410, 2205]
    assert all(np.frombuffer(bytes(c), dtype="<i2").any() for c in chunks)
    assert [e[2] for e in events if "ready (" in e[2]] == [
        "segment 1 ready (0.20 s of audio)",
        "segment 2 ready (0.40 s of audio)",
        "segment 3 ready (0.50 s of audio)",
    ]
    (finished,) = [e for e in calls() if e["event"] == "finished"]
    assert finished["produced"] == 3


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
    engine = _loaded(IndexTTS2Engine, ckpt)
    request = _request(IndexTTS2Engine, voice, text="w " * 7, max_text_tokens_per_segment=3, interval_silence=0)
    chunks = _speak(engine, request)
    assert len(chunks) == 3
    assert np.array_equal(np.concatenate(chunks), every)


def test_pcm_scale_chunks_from_a_unit_scale_flavour_are_not_blown_up(
    ckpt: Path, voice: str, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A flavour detected as [-1, 1] that streams PCM-scale floats after all is caught by the peak.
    standin("pypi")
    engine = _loaded(IndexTTS2Engine, ckpt)
    assert engine.flavour.unit_scale
    core = sys.modules["indextts._standin_core"]
    monkeypatch.setattr(core, "_chunk", lambda int16, unit_scale: core.FakeTensor(int16.astype(np.float32)))
    chunks = _speak(engine, _request(IndexTTS2Engine, voice, text="a b", interval_silence=0))
    assert int(np.max(np.abs(np.concatenate(chunks)))) == 12000


@pytest.mark.parametrize("interval_silence", [100, 0])
def test_the_stream_matches_the_non_streaming_tuple_sample_for_sample(
    interval_silence: int, ckpt: Path, voice: str, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt)
    request = _request(
        IndexTTS2Engine, voice, text="a b c", max_text_tokens_per_segment=1, interval_silence=interval_silence
    )
    streamed = np.concatenate(_speak(engine, request))
    monkeypatch.setenv("INDEXTTS_STANDIN_NO_STREAM", "1")  # an upstream that ignores stream_return
    (whole,) = _speak(engine, request)
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
    engine = _loaded(IndexTTS2Engine, ckpt)
    # The voice passed check() and is gone when upstream reads it, at the first next().
    gone = tmp_path / "gone.wav"
    gone.write_bytes(b"RIFF")
    request = _request(IndexTTS2Engine, str(gone))
    engine.check(request)
    gone.unlink()
    events: list[tuple[Any, ...]] = []
    with pytest.raises(EngineError) as info:
        list(engine.synthesize(request, lambda *a: events.append(a), _never))
    assert str(info.value).startswith("preparing the references failed: FileNotFoundError: ")
    assert (info.value.code, info.value.field) == ("engine_error", "$.voice")
    assert events and {e[0] for e in events} == {"prepare"}
    # Any other failure there: no field.
    monkeypatch.setenv("INDEXTTS_STANDIN_INFER_ERROR", "CUDA out of memory")
    with pytest.raises(EngineError) as info:
        _speak(engine, _request(IndexTTS2Engine, voice))
    assert str(info.value) == "preparing the references failed: RuntimeError: CUDA out of memory"
    assert (info.value.code, info.value.field) == ("engine_error", None)
    assert len(_infer_calls(calls())) == 2 and not any(e["event"] == "segment" for e in calls())
    monkeypatch.delenv("INDEXTTS_STANDIN_INFER_ERROR")
    assert len(_speak(engine, _request(IndexTTS2Engine, voice))) == 1, "the model stays usable"


def test_a_failing_emotion_clip_is_named_as_such(
    ckpt: Path, voice: str, tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt)
    clip = tmp_path / "clip.wav"
    clip.write_bytes(b"RIFF clip")
    request = _request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=str(clip)))
    engine.check(request)
    clip.unlink()  # gone by the time upstream reads it
    with pytest.raises(EngineError) as info:
        list(engine.synthesize(request, _progress, _never))
    assert str(info.value).startswith("preparing the references failed: FileNotFoundError: ")
    assert info.value.field == "$.emotion.path"


def test_cancel_takes_effect_between_segments(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt)
    request = _request(IndexTTS2Engine, voice, text="a b c d e f g h i j", max_text_tokens_per_segment=1)
    received = []

    def consume() -> None:
        # The consumer cancels as soon as it holds the first chunk.
        for chunk in engine.synthesize(request, _progress, lambda: bool(received)):
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
    engine = _loaded(IndexTTS2Engine, ckpt)
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
    assert _speak(engine, _request(IndexTTS2Engine, voice, text="hello world", **options))
    assert _speak(engine, _request(IndexTTS2Engine, voice, text="plain"))
    first, second = _infer_calls(calls())
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
    engine = _loaded(IndexTTS2Engine, ckpt)
    _speak(engine, _request(IndexTTS2Engine, voice, emotion=emotion, **options))
    (infer,) = _infer_calls(calls())
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
    engine = _loaded(IndexTTS2Engine, ckpt)
    _speak(engine, _request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=str(clip), alpha=0.4)))
    (infer,) = _infer_calls(calls())
    assert infer["kwargs"]["emo_audio_prompt"] == str(clip) and infer["kwargs"]["emo_alpha"] == 0.4
    references = [(e["role"], e["path"]) for e in calls() if e["event"] == "reference"]
    assert references == [("speaker", voice), ("emotion", str(clip))]


def test_25_lang_and_duration(
    ckpt25: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    engine = _loaded(IndexTTS25Engine, ckpt25)
    _speak(engine, _request(IndexTTS25Engine, voice))
    _speak(engine, _request(IndexTTS25Engine, voice, lang="ZH", duration_factor=1.5, text_normalization=False))
    ja_engine = _loaded(IndexTTS25Engine, ckpt25, lang="ja")
    _speak(ja_engine, _request(IndexTTS25Engine, voice))
    default, explicit, engine_default = _infer_calls(calls())
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
    engine = _loaded(IndexTTS25Engine, ckpt25)
    request = _request(IndexTTS25Engine, voice, text="a b c", max_text_tokens_per_segment=1, interval_silence=50)
    assert [len(c) for c in _speak(engine, request)] == [2205, 1102, 2205, 1102, 2205]


def test_more_segment_before_is_refused_on_25(
    ckpt25: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    # Upstream 2.5 passes it on as quick_streaming_tokens, which it never reads.
    standin("v25")
    for cls in (IndexTTS25Engine, IndexTTSAuto):
        engine = _engine(cls, model_dir=str(ckpt25))
        request = _request(cls, voice, more_segment_before=2)
        with pytest.raises(RequestError) as info:
            engine.check(request)  # known before the load: the directory is 2.5
        assert (info.value.code, info.value.field) == ("unknown_option", "$.options.more_segment_before")
        engine.load(_progress, _never)
        with pytest.raises(RequestError):
            list(engine.synthesize(request, _progress, _never))
    assert _infer_calls(calls()) == []


def test_flavour_specific_options_are_rejected_after_load(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("pypi")
    engine = _loaded(IndexTTS2Engine, ckpt)
    with pytest.raises(RequestError) as info:
        engine.check(_request(IndexTTS2Engine, voice, more_segment_before=1))
    assert (info.value.code, info.value.field) == ("unknown_option", "$.options.more_segment_before")
    _speak(engine, _request(IndexTTS2Engine, voice, quick_streaming_tokens=5))
    (infer,) = _infer_calls(calls())
    assert infer["kwargs"]["quick_streaming_tokens"] == 5 and "more_segment_before" not in infer["kwargs"]


def test_auto_on_a_2_directory_refuses_25_options(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")  # the code of both versions is installed: the directory decides
    engine = _engine(IndexTTSAuto, model_dir=str(ckpt))
    for name, value in (("duration_factor", 0.8), ("lang", "en"), ("text_normalization", False)):
        request = _request(IndexTTSAuto, voice, **{name: value})
        with pytest.raises(RequestError) as info:
            engine.check(request)  # known before the load, from the directory
        assert (info.value.code, info.value.field) == ("unknown_option", f"$.options.{name}")
        assert "this checkpoint is IndexTTS-2" in str(info.value)
    engine.load(_progress, _never)
    assert engine.flavour.kind == "2"
    with pytest.raises(RequestError) as info:
        list(engine.synthesize(_request(IndexTTSAuto, voice, duration_factor=0.8), _progress, _never))
    assert info.value.field == "$.options.duration_factor"
    assert _infer_calls(calls()) == []
    _speak(engine, _request(IndexTTSAuto, voice))
    (infer,) = _infer_calls(calls())
    assert "lang" not in infer["kwargs"] and infer["module"] == "indextts.infer_v2"


def test_emotion_text_on_25_without_qwen_never_reaches_upstream(
    ckpt25: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    engine = _loaded(IndexTTSAuto, ckpt25)  # resolves to 2.5, whose default is use_qwen_emo=False
    assert engine.flavour.kind == "2.5"
    request = _request(IndexTTSAuto, voice, emotion=EmotionText(text="happy"))
    with pytest.raises(RequestError, match="use_qwen_emo=true") as info:
        engine.check(request)
    assert info.value.field == "$.emotion"
    with pytest.raises(RequestError):
        list(engine.synthesize(request, _progress, _never))
    assert _infer_calls(calls()) == []
    with_qwen = _loaded(IndexTTS25Engine, ckpt25, use_qwen_emo=True)
    _speak(with_qwen, _request(IndexTTS25Engine, voice, emotion=EmotionText(text="happy")))
    assert _infer_calls(calls())[-1]["kwargs"]["use_emo_text"] is True


def test_sampling_options_the_accelerated_gpt_ignores_are_refused(
    ckpt: Path,
    voice: str,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INDEXTTS_STANDIN_CUDA", "1")  # upstream builds its accel engine on CUDA only
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt, use_accel=True)
    for name, value in (("top_p", 0.5), ("top_k", 5), ("num_beams", 2), ("repetition_penalty", 2.0)):
        with pytest.raises(RequestError) as info:
            engine.check(_request(IndexTTS2Engine, voice, **{name: value}))
        assert (info.value.code, info.value.field) == ("unknown_option", f"$.options.{name}")
    _speak(engine, _request(IndexTTS2Engine, voice, temperature=0.5, max_mel_tokens=100))
    (infer,) = _infer_calls(calls())
    assert (infer["kwargs"]["temperature"], infer["kwargs"]["max_mel_tokens"]) == (0.5, 100)
    # Without CUDA there is no accel engine, and every option counts.
    monkeypatch.delenv("INDEXTTS_STANDIN_CUDA")
    _loaded(IndexTTS2Engine, ckpt, use_accel=True).check(_request(IndexTTS2Engine, voice, top_p=0.5))


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
    engine = _loaded(IndexTTS2Engine, ckpt)
    for path in (a, b, a, b):
        assert _speak(engine, _request(IndexTTS2Engine, str(path)))
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
    engine = _loaded(IndexTTS2Engine, ckpt)
    _speak(engine, _request(IndexTTS2Engine, str(voice)))
    voice.write_bytes(b"RIFF second take, longer")  # same path: upstream's slot would reuse the first take
    _speak(engine, _request(IndexTTS2Engine, str(voice)))
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
    engine = _loaded(IndexTTS2Engine, ckpt, voice_cache=0)
    for path in (a, b, a):
        _speak(engine, _request(IndexTTS2Engine, str(path)))
    assert [r for r in _references(calls) if r[0] == "speaker"] == [("speaker", n) for n in ("a.wav", "b.wav", "a.wav")]
    assert engine.info()["voice_cache"]["entries"] == 0


def test_voice_cache_0_still_reuses_upstreams_slot_for_a_repeated_voice(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt, voice_cache=0)
    for _ in range(2):
        _speak(engine, _request(IndexTTS2Engine, voice))
    assert _references(calls) == [("speaker", "speaker.wav"), ("emotion", "speaker.wav")]


def test_a_cached_voice_with_another_emotion_clip(
    ckpt: Path, voice: str, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    clip = tmp_path / "angry.wav"
    clip.write_bytes(b"RIFF angry")
    engine = _loaded(IndexTTS2Engine, ckpt)
    _speak(engine, _request(IndexTTS2Engine, voice))
    _speak(engine, _request(IndexTTS2Engine, voice, emotion=EmotionAudio(path=str(clip))))
    _speak(engine, _request(IndexTTS2Engine, voice))
    segments = [e for e in calls() if e["event"] == "segment"]
    own = hashlib.sha256(Path(voice).read_bytes()).hexdigest()[:16]
    angry = hashlib.sha256(clip.read_bytes()).hexdigest()[:16]
    assert [(s["speaker"], s["emotion"]) for s in segments] == [(own, own), (own, angry), (own, own)]


def test_the_standins_match_upstream_where_the_adapter_relies_on_it(
    ckpt: Path, voice: str, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    """What upstream does that the adapter must cope with, checked on the stand-in directly."""
    standin("v2")
    module = importlib.import_module("indextts.infer_v2")
    model = module.IndexTTS2(cfg_path=str(ckpt / "config.yaml"), model_dir=str(ckpt), use_qwen_emo=False)
    # stream_return=True: an unstarted generator, whatever is wrong with the request.
    bad = model.infer(voice, "a", None, stream_return=True, use_emo_text=True)
    assert [e["event"] for e in calls()][-1] == "infer"
    with pytest.raises(RuntimeError, match="use_emo_text=True requires QwenEmotion"):
        next(bad)
    # Unknown generation keywords reach Hugging Face generate, which raises; do_sample is popped.
    with pytest.raises(ValueError, match=r"not used by the model: \['bogus'\]"):
        next(model.infer(voice, "a", None, stream_return=True, bogus=1))
    assert len(list(model.infer(voice, "a", None, stream_return=True, do_sample=False))) == 2
    # Empty text raises in both modes; it never returns None.
    with pytest.raises(RuntimeError, match="non-empty list"):
        model.infer(voice, " ", None)
    with pytest.raises(RuntimeError, match="non-empty list"):
        list(model.infer(voice, "", None, stream_return=True))
    # A silence after every segment, the last one too; with interval_silence=0, the list of segments.
    items = list(model.infer(voice, "a b", None, stream_return=True, max_text_tokens_per_segment=1))
    assert [type(i).__name__ for i in items] == ["FakeTensor"] * 4 and items[3].shape == (1, 4410)
    items = list(model.infer(voice, "a b", None, stream_return=True, max_text_tokens_per_segment=1, interval_silence=0))
    assert isinstance(items[1], list) and items[1] is items[3] and len(items[3]) == 2
    rate, wav = model.infer(voice, "a b", None, max_text_tokens_per_segment=1)
    assert rate == 22050 and wav.dtype == np.int16 and wav.shape == (2 * 2205 + 4410, 1)


def test_the_pypi_constructor_matches_2_1_1(standin: Callable[[str], None]) -> None:
    standin("pypi")
    module = importlib.import_module("indextts.infer_v2")
    assert list(inspect.signature(module.IndexTTS2.__init__).parameters) == [
        "self",
        "model_dir",
        "cfg_path",
        "use_fp16",
        "device",
        "use_cuda_kernel",
        "use_deepspeed",
        "use_accel",
        "use_torch_compile",
        "language",
        "attn_backend",
    ]


# ----------------------------------------------------------------- memory and unload


def _fake_torch(cuda: bool = False, mps: bool = False, log: list[str] | None = None) -> Any:
    events = log if log is not None else []
    cuda_ns = types.SimpleNamespace(
        is_available=lambda: cuda,
        is_initialized=lambda: cuda,
        memory_allocated=lambda: 1000,
        memory_reserved=lambda: 2000,
        empty_cache=lambda: events.append("cuda.empty_cache"),
    )
    mps_ns = types.SimpleNamespace(
        current_allocated_memory=lambda: 300,
        driver_allocated_memory=lambda: 400,
        empty_cache=lambda: events.append("mps.empty_cache"),
    )
    backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps))
    return types.SimpleNamespace(cuda=cuda_ns, mps=mps_ns, backends=backends)


def test_memory_never_imports_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    engine = _engine(IndexTTS2Engine)
    assert engine.memory() == {}
    assert "torch" not in sys.modules


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [
        (True, False, {"cuda_allocated": 1000, "cuda_reserved": 2000}),
        (False, True, {"mps_allocated": 300, "mps_driver": 400}),
        (False, False, {}),
    ],
)
def test_memory_reports_the_accelerator(
    cuda: bool, mps: bool, expected: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda=cuda, mps=mps))
    assert _engine(IndexTTS2Engine).memory() == expected


def test_memory_survives_a_half_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())  # as seen mid-import
    assert _engine(IndexTTS2Engine).memory() == {}


def test_unload_frees_the_model_and_the_cuda_cache(
    ckpt: Path,
    voice: str,
    standin: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    standin("v2")
    engine = _loaded(IndexTTS2Engine, ckpt)
    events: list[str] = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda=True, log=events))
    engine.unload()
    assert not engine.loaded and events == ["cuda.empty_cache"]
    engine.unload()  # idempotent
    assert events == ["cuda.empty_cache"]
    engine.load(_progress, _never)
    assert len([c for c in calls() if c["event"] == "__init__"]) == 2
    assert _speak(engine, _request(IndexTTS2Engine, voice))


def test_stage_times_are_read_from_upstreams_stdout_which_still_gets_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import sys

    from indextts_sidecar.engines.indextts._upstream import StageTimes

    real = io.StringIO()
    monkeypatch.setattr(sys, "stdout", real)
    times = StageTimes()
    with times.capturing():
        print(">> gpt_gen_time: 1.25 seconds")
        with times.capturing():  # nested: no loop of the stream onto itself
            print(">> s2mel_", end="")  # a line in two writes
            print("time: 0.50 seconds")
        kept = sys.stdout
        print(">> Total inference time: 9.00 seconds")
    assert sys.stdout is real
    kept.write(">> bigvgan_time: 2 seconds\nafter\n")  # a reference kept past the capture still writes through
    assert times.stages == {"gpt_gen": 1.25, "s2mel": 0.5, "bigvgan": 2.0}
    assert real.getvalue() == (
        ">> gpt_gen_time: 1.25 seconds\n>> s2mel_time: 0.50 seconds\n>> Total inference time: 9.00 seconds\n"
        ">> bigvgan_time: 2 seconds\nafter\n"
    )
    times.write("x" * 10_000)  # a line without its end is kept bounded
    assert len(times._partial) <= 256

"""Engine and request options (engines/indextts/_options.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from indextts_sidecar.engines.indextts import (
    IndexTTS2Options,
    IndexTTS2RequestOptions,
    IndexTTS25Options,
    IndexTTS25RequestOptions,
    IndexTTSAutoOptions,
)
from indextts_sidecar.protocol.options import parse_options

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

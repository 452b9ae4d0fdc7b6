"""The stand-ins in tests/standin behave as upstream does where the adapter relies on it."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest


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

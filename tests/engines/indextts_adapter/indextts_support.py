"""Helpers the IndexTTS adapter's tests share: engines from option maps, requests, speaking one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from indextts_sidecar.engines import SynthesisRequest
from indextts_sidecar.protocol import Emotion


def upstream_aux_paths(ckpt: Path) -> dict[str, str]:
    """Upstream's aux_paths for the auxiliary models in <ckpt>/hf_cache."""
    cache = ckpt / "hf_cache"
    return {
        "w2v_bert": str(cache / "w2v-bert-2.0"),
        "semantic_codec": str(cache / "semantic_codec_model.safetensors"),
        "campplus": str(cache / "campplus_cn_common.bin"),
        "bigvgan": str(cache / "bigvgan"),
    }


def ignore_progress(*args: Any) -> None:
    pass


def never() -> bool:
    return False


def make_engine(cls: type[Any], **options: Any) -> Any:
    return cls(msgspec.convert(options, cls.Options))


def make_request(
    cls: type[Any], voice: str | None, text: str = "one two three", emotion: Emotion | None = None, **options: Any
) -> SynthesisRequest[Any]:
    return SynthesisRequest(
        id=1, text=text, voice=voice, emotion=emotion, options=msgspec.convert(options, cls.RequestOptions)
    )


def infer_calls(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["event"] == "infer"]


def loaded_engine(cls: type[Any], ckpt: Path, **options: Any) -> Any:
    engine = make_engine(cls, model_dir=str(ckpt), **options)
    engine.load(ignore_progress, never)
    return engine


def speak(engine: Any, request: SynthesisRequest[Any], cancelled: Callable[[], bool] = never) -> list[np.ndarray]:
    engine.check(request)
    return [
        np.frombuffer(memoryview(c).cast("B"), dtype="<i2").copy()
        for c in engine.synthesize(request, ignore_progress, cancelled)
    ]

"""Model output to int16 (engines/indextts/_pcm.py)."""

from __future__ import annotations

import numpy as np
import pytest

from indextts_sidecar.engines import EngineError
from indextts_sidecar.engines.indextts import to_pcm16

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

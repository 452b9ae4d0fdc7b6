"""Streaming sample-rate conversion: chunked output equals whole-signal output."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from indextts_sidecar._resample import BlockResampler, LinearResampler, make_resampler, resampled


def whole_linear(samples: Any, source: int, target: int) -> Any:
    """A whole-signal resampler with local support: linear interpolation at exact positions."""
    count = math.ceil(len(samples) * target / source)
    positions = np.arange(count) * (source / target)
    return np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)


@pytest.mark.parametrize(("source", "target"), [(22050, 16000), (22050, 24000), (22050, 44100), (16000, 22050)])
def test_block_resampler_streams_exactly_as_the_whole_signal(source: int, target: int) -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(source) * 3000).astype("<i2")
    expected = np.clip(np.rint(whole_linear(x.astype(np.float32), source, target)), -32768, 32767).astype("<i2")
    converter = BlockResampler(source, target, whole_linear)
    out = bytearray()
    position = 0
    while position < len(x):
        size = int(rng.integers(1, 3000))
        out += converter.feed(x[position : position + size].tobytes())
        position += size
    out += converter.flush()
    got = np.frombuffer(bytes(out), "<i2")
    assert len(got) == math.ceil(len(x) * target / source) == len(expected)
    # The last few samples differ: the whole-signal interpolation clamps at the end, the
    # block version sees the zeros a band-limited resampler pads with.
    assert np.array_equal(got[:-4], expected[:-4])


def test_block_resampler_with_nothing_fed_gives_nothing() -> None:
    converter = BlockResampler(22050, 16000, whole_linear)
    assert converter.flush() == b""


def test_without_torch_loaded_the_linear_resampler_is_used() -> None:
    assert isinstance(make_resampler(22050, 16000), LinearResampler)


def test_resampled_closes_its_source_and_flushes() -> None:
    closed = []

    def source() -> Any:
        try:
            yield np.ones(22050, dtype="<i2").tobytes()
        finally:
            closed.append(True)

    chunks = list(resampled(source(), 22050, 11025))
    assert sum(len(c) for c in chunks) // 2 == 11025
    assert closed == [True]

"""Streaming sample-rate conversion: band-limited on every path, chunked output equals whole-signal output."""

from __future__ import annotations

import itertools
import math
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from indextts_sidecar._jobs import Job, Sink
from indextts_sidecar._resample import (
    BlockResampler,
    _to_pcm16,
    available_methods,
    make_resampler,
    rescale_position,
    rescale_words,
    sinc_resample,
)
from indextts_sidecar.engines import SynthesisRequest, Words
from indextts_sidecar.engines.fake import FakeRequestOptions
from indextts_sidecar.protocol import Done, WordSpan

METHODS = available_methods()


def whole_linear(samples: Any, source: int, target: int) -> Any:
    """A whole-signal resampler with local support: linear interpolation at exact positions."""
    count = math.ceil(len(samples) * target / source)
    positions = np.arange(count) * (source / target)
    return np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)


def stream(method: str, x: np.ndarray, source: int, target: int, seed: int = 5) -> np.ndarray:
    """``x`` through ``method``'s converter in random-sized chunks."""
    rng = np.random.default_rng(seed)
    converter = make_resampler(source, target, method)
    out = bytearray()
    position = 0
    while position < len(x):
        size = int(rng.integers(1, 3000))
        out += converter.feed(x[position : position + size].tobytes())
        position += size
    out += converter.flush()
    return np.frombuffer(bytes(out), "<i2")


def tone(frequency: float, rate: int = 22050, seconds: float = 2.0, amplitude: float = 16000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * frequency * t)).astype("<i2")


def level(samples: np.ndarray, frequency: float, rate: int) -> float:
    """Amplitude of the ``frequency`` component in the middle half of ``samples`` (least squares)."""
    middle = samples[len(samples) // 4 : 3 * len(samples) // 4].astype(np.float64)
    phase = 2 * np.pi * frequency * np.arange(len(middle)) / rate
    basis = np.stack([np.sin(phase), np.cos(phase)], axis=1)
    (a, b), *_ = np.linalg.lstsq(basis, middle, rcond=None)
    return float(np.hypot(a, b))


def test_the_numpy_converter_is_always_there_and_soxr_comes_first_when_installed() -> None:
    assert METHODS[-1] == "numpy"
    try:
        import soxr  # noqa: F401
    except ImportError:
        assert "soxr" not in METHODS
    else:
        assert METHODS[0] == "soxr"
    if "torch" not in sys.modules:
        assert "torchaudio" not in METHODS
    with pytest.raises(ValueError, match="unknown resampling method 'linear'"):
        make_resampler(22050, 16000, "linear")


@pytest.mark.parametrize("method", METHODS)
def test_a_tone_above_the_new_nyquist_is_stopped(method: str) -> None:
    # 10 kHz at 22050 Hz is above 16 kHz's Nyquist (8 kHz): unfiltered it would alias to 6 kHz.
    out = stream(method, tone(10000), 22050, 16000)
    assert len(out) == 32000
    middle = out[len(out) // 4 : 3 * len(out) // 4].astype(np.float64)
    rms = math.sqrt(float(np.mean(middle**2)))
    attenuation = 20 * math.log10((16000 / math.sqrt(2)) / max(rms, 1e-9))
    assert attenuation >= 60, f"{method}: only {attenuation:.1f} dB"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("frequency", [100.0, 1000.0, 4000.0, 6000.0, 7200.0])
def test_the_passband_is_flat_up_to_nine_tenths_of_the_new_nyquist(method: str, frequency: float) -> None:
    out = stream(method, tone(frequency), 22050, 16000)
    gain_db = 20 * math.log10(level(out, frequency, 16000) / 16000)
    assert abs(gain_db) <= 0.1, f"{method} at {frequency} Hz: {gain_db:+.3f} dB"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("source", "target"), [(22050, 16000), (22050, 24000), (16000, 22050), (24000, 8000)])
def test_streamed_equals_whole(method: str, source: int, target: int) -> None:
    x = (np.random.default_rng(7).standard_normal(source * 2) * 3000).astype("<i2")
    whole = make_resampler(source, target, method)
    expected = np.frombuffer(whole.feed(x.tobytes()) + whole.flush(), "<i2")
    got = stream(method, x, source, target)
    assert len(got) == len(expected) == math.ceil(len(x) * target / source)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize(("source", "target"), [(22050, 16000), (22050, 44100), (16000, 22050)])
def test_the_numpy_converter_streams_exactly_as_its_whole_signal_function(source: int, target: int) -> None:
    x = (np.random.default_rng(9).standard_normal(source) * 3000).astype("<i2")
    expected = np.frombuffer(_to_pcm16(sinc_resample(x.astype(np.float32), source, target)), "<i2")
    got = stream("numpy", x, source, target)
    assert len(got) == len(expected) == math.ceil(len(x) * target / source)
    assert np.array_equal(got, expected)


@pytest.mark.skipif("torchaudio" not in METHODS, reason="torch is not loaded here, or torchaudio is not installed")
def test_the_numpy_filter_is_torchaudios() -> None:
    from indextts_sidecar._resample import _torchaudio_resample

    torchaudio_resample = _torchaudio_resample()
    assert torchaudio_resample is not None
    x = (np.random.default_rng(11).standard_normal(22050) * 3000).astype(np.float32)
    np.testing.assert_allclose(sinc_resample(x, 22050, 16000), torchaudio_resample(x, 22050, 16000), atol=0.05)


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


class _Frames:
    """A stand-in for a connection's JobOutput: keeps the audio frames a sink writes."""

    frame_bytes = 4096
    frame_words = 16
    done_words = 16

    def __init__(self) -> None:
        self.pcm = bytearray()
        self.words: list[WordSpan] = []

    def audio(self, job: Job, seq: int, rate: int, pcm: memoryview, words: Any = ()) -> bool:
        self.pcm += pcm
        self.words += words
        return True


def _sink(rate: int, native: int, out: _Frames) -> Sink:
    options = FakeRequestOptions()
    request = SynthesisRequest(id=1, text="hello you", voice=None, emotion=None, options=options, sample_rate=rate)
    sink = Sink(Job(1, "synthesize", request), out)  # type: ignore[arg-type]
    sink.start(native)
    return sink


@pytest.mark.parametrize("method", METHODS)
def test_a_sink_converts_each_chunk_and_flushes_at_done(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("indextts_sidecar._resample.available_methods", lambda: [method])
    out = _Frames()
    sink = _sink(11025, 22050, out)
    assert sink.chunk(np.full(22050, 1000, dtype="<i2").tobytes()) is None
    done = sink.done()
    assert isinstance(done, Done) and done.sample_rate == 11025
    samples = np.frombuffer(bytes(out.pcm), "<i2")
    assert done.samples == len(samples) == 11025
    # A constant stays that constant away from the edges (unit gain at 0 Hz).
    assert np.all(np.abs(samples[1000:-1000].astype(int) - 1000) <= 1)


rates = st.integers(1000, 192000)


@given(rates, rates, st.integers(1, 10**7), st.data())
def test_a_word_inside_the_audio_stays_inside_the_converted_audio(
    source: int, target: int, length: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, length - 1))
    end = data.draw(st.integers(start, length))
    (word,) = rescale_words([WordSpan(3, 7, start, end)], source, target)
    converted = math.ceil(length * target / source)  # the converted signal's length
    assert (word.start_char, word.end_char) == (3, 7)
    assert 0 <= word.start <= word.end <= converted
    assert word.start < converted
    assert word.start == start * target // source == rescale_position(start, source, target)


@given(rates, rates, st.lists(st.integers(0, 10**7), min_size=2, max_size=20))
def test_rescaling_keeps_every_word_and_their_order(source: int, target: int, positions: list[int]) -> None:
    positions.sort()
    words = [WordSpan(i, i + 1, a, b) for i, (a, b) in enumerate(itertools.pairwise(positions))]
    moved = rescale_words(words, source, target)
    assert [(w.start_char, w.end_char) for w in moved] == [(w.start_char, w.end_char) for w in words]
    assert all(w.start <= w.end for w in moved)
    assert all(a.start <= b.start for a, b in itertools.pairwise(moved))


@pytest.mark.parametrize("method", METHODS)
def test_a_sink_moves_words_to_the_new_rate(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("indextts_sidecar._resample.available_methods", lambda: [method])
    out = _Frames()
    sink = _sink(16000, 22050, out)
    chunk = np.zeros(2205, dtype="<i2").tobytes()
    for item in (Words([WordSpan(0, 5, 0, 2205)]), chunk, Words([WordSpan(6, 9, 2205, 4410)]), chunk):
        assert sink.chunk(item) is None
    done = sink.done()
    assert isinstance(done, Done)
    assert out.words + list(done.words) == [WordSpan(0, 5, 0, 1600), WordSpan(6, 9, 1600, 3200)]
    if method == "soxr":  # soxr's own length may differ by a few samples
        assert abs(done.samples - 3200) <= 16
    else:
        assert done.samples == 3200

"""Encoders from int16 mono samples to each of OpenAI's response formats.

``pcm`` and ``wav`` are written here (a header and the samples); ``mp3``, ``aac`` (ADTS),
``opus`` (Ogg) and ``flac`` are encoded by PyAV, FFmpeg's bindings, whose wheels carry
libmp3lame, libopus and FFmpeg's own aac and flac encoders (docs/dependencies.md says
why PyAV).  An encoder is fed samples as they arrive and hands back the bytes that are
ready; :meth:`Encoder.finish` flushes the rest.
"""

from __future__ import annotations

import importlib
import io
import struct
from types import ModuleType
from typing import Union

import numpy as np

from .._audio import Samples
from .._service import Kind, Refusal

__all__ = ["STREAMABLE", "Encoder", "make_encoder", "wav_header"]

#: Formats whose container can be written front to back as the audio arrives.
STREAMABLE = frozenset({"mp3", "aac", "opus", "pcm", "wav"})

#: (container, codec, the rates the codec takes) per PyAV format; another rate is resampled
#: by PyAV to the nearest rate at or above it that the codec takes.
_AV = {
    "mp3": ("mp3", "libmp3lame", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "aac": ("adts", "aac", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("ogg", "libopus", (48000,)),
    "flac": ("flac", "flac", ()),
}
#: An Ogg page per 40 ms of opus: a segment's bytes leave with it (longer pages hold back its end).
_OGG_PAGE_US = "40000"


def wav_header(rate: int, samples: Union[int, None]) -> bytes:
    """A 16-bit mono WAV header; ``samples=None`` (streamed: the length is not known yet)
    writes the largest sizes the fields hold, which readers take as "to the end"."""
    data = 0xFFFFFFFF - 36 if samples is None else samples * 2
    return b"RIFF" + struct.pack(
        "<I4s4sIHHIIHH4sI", min(36 + data, 0xFFFFFFFF), b"WAVE", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16, b"data", data
    )


class Encoder:
    """Samples in (int16 mono at ``rate``), bytes out."""

    #: Whether a call takes long enough to belong in a worker thread.
    blocking = False

    def __init__(self, rate: int) -> None:
        self.rate = rate

    def feed(self, samples: Samples) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        return b""


class _Pcm(Encoder):
    def feed(self, samples: Samples) -> bytes:
        return samples.astype("<i2", copy=False).tobytes()


class _StreamedWav(_Pcm):
    def __init__(self, rate: int) -> None:
        super().__init__(rate)
        self._header: Union[bytes, None] = wav_header(rate, None)

    def feed(self, samples: Samples) -> bytes:
        header, self._header = self._header or b"", None
        return header + super().feed(samples)

    def finish(self) -> bytes:
        return self._header or b""  # no audio at all: still a WAV header


class _WholeWav(_Pcm):
    def __init__(self, rate: int) -> None:
        super().__init__(rate)
        self._parts: list[bytes] = []
        self._samples = 0

    def feed(self, samples: Samples) -> bytes:
        self._parts.append(super().feed(samples))
        self._samples += len(samples)
        return b""

    def finish(self) -> bytes:
        return wav_header(self.rate, self._samples) + b"".join(self._parts)


class _Sink:
    """A write-only file for PyAV's muxer: collects what it writes until taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Union[bytes, bytearray, memoryview]) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def _av() -> ModuleType:
    try:
        return importlib.import_module("av")
    except ImportError:
        raise Refusal(
            Kind.INVALID,
            "this format needs PyAV on the server: pip install av (the [server] extra)",
            param="response_format",
            code="unsupported_format",
        ) from None


class _AvEncoder(Encoder):
    blocking = True

    def __init__(self, fmt: str, rate: int) -> None:
        super().__init__(rate)
        av = _av()
        container, codec, rates = _AV[fmt]
        self._av = av
        self._whole_file = io.BytesIO()  # flac's: seekable, the muxer writes the exact length at the end
        self._sink = _Sink()
        file = self._whole_file if fmt == "flac" else self._sink
        options = {"page_duration": _OGG_PAGE_US} if container == "ogg" else {}
        self._container = av.open(file, mode="w", format=container, options=options)
        out_rate = next((r for r in rates if r >= rate), rates[-1]) if rates else rate
        self._stream = self._container.add_stream(codec, rate=out_rate, layout="mono")
        self._pts = 0
        self._whole = fmt == "flac"

    def _mux(self, frame: object) -> bytes:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def feed(self, samples: Samples) -> bytes:
        if not len(samples):
            return b""
        data = np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(data, format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += data.shape[1]
        return self._mux(frame)

    def finish(self) -> bytes:
        tail = self._mux(None)
        self._container.close()
        return self._whole_file.getvalue() if self._whole else tail + self._sink.take()


def make_encoder(fmt: str, rate: int, *, streamed: bool) -> Encoder:
    """The encoder for ``fmt`` at ``rate`` Hz; ``streamed`` only changes WAV's header."""
    if fmt == "pcm":
        return _Pcm(rate)
    if fmt == "wav":
        return _StreamedWav(rate) if streamed else _WholeWav(rate)
    return _AvEncoder(fmt, rate)


def check_available(fmt: str) -> None:
    """Raise the 400 that says PyAV is missing, before any work, for the formats that need it."""
    if fmt in _AV:
        _av()

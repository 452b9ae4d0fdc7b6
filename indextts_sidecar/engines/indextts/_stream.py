"""Upstream's stream as the adapter reads it: segment by segment with a heartbeat while each
computes, the silence held back between segments, samples counted, and which reference clip
an early failure is about.  :class:`Tally` serves a lone request (:func:`stream_segments`,
used by ``_adapter.py``) and each request of a batch (``_batch_run.py``) alike."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Union

from ...protocol.segments import segment_text_message
from .. import Cancelled, EngineError, ProgressFn, heartbeat
from ._batched import Decoding, decoding
from ._install import Flavour
from ._pcm import UNIT_SCALE_CEILING, as_numpy, peak, to_pcm16
from ._segments import SegmentTexts
from ._upstream import StageTimes

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "END",
    "HEARTBEAT_INTERVAL",
    "NATIVE_SAMPLE_RATE",
    "Tally",
    "check_rate",
    "failed_reference",
    "next_chunk",
    "stream_segments",
    "within",
]

log = logging.getLogger("indextts_sidecar.engines.indextts")

#: IndexTTS-2 and 2.5 both emit 22050 Hz mono.
NATIVE_SAMPLE_RATE = 22050
#: Seconds between heartbeats while a long step runs (constructing, generating a segment).
HEARTBEAT_INTERVAL = 2.0


class Tally:
    """A stream's segments and samples so far, and the silence held back until the next segment."""

    def __init__(self, flavour: Flavour, texts: SegmentTexts) -> None:
        self.flavour = flavour
        self.texts = texts
        self.unit_scale = flavour.unit_scale
        self.segments = 0
        self.samples = 0
        self.held: Any = None

    @property
    def seconds(self) -> float:
        return self.samples / NATIVE_SAMPLE_RATE

    def segment(self, chunk: Any, progress: ProgressFn) -> Iterator[npt.NDArray[Any]]:
        """The held silence, if any, then ``chunk`` as int16; counts it and reports a segment ready."""
        if self.held is not None:
            pcm_silence = to_pcm16(self.held, unit_scale=False)
            self.held = None
            if pcm_silence.size:
                self.samples += pcm_silence.size
                yield pcm_silence
        array = as_numpy(chunk)
        loudest = peak(array)
        if self.unit_scale and loudest > UNIT_SCALE_CEILING:
            log.warning("%s streamed PCM-scale floats (peak %.0f); treating it as such", self.flavour.label, loudest)
            self.unit_scale = False
        pcm = to_pcm16(array, unit_scale=self.unit_scale)
        self.samples += pcm.size
        if not self.flavour.silence_after_each and pcm.size and not pcm.any():
            yield pcm  # indextts25 yields the silence between segments as an item of its own
            return
        words = self.texts.text(self.segments)
        self.segments += 1
        if words is not None:  # the audio after it speaks these words (protocol.segments)
            progress("synthesize", None, segment_text_message(words))
        progress("synthesize", None, f"segment {self.segments} ready ({self.seconds:.2f} s of audio)")
        if pcm.size:
            yield pcm


def failed_reference(exc: Union[BaseException, None], voice: str, emotion_path: Union[str, None]) -> Union[str, None]:
    """The request field naming the reference clip an error is about, when it says which."""
    if not isinstance(exc, (OSError, EOFError)):
        return None
    filename = getattr(exc, "filename", None)
    if filename is not None and emotion_path is not None and os.fspath(filename) == emotion_path:
        return "$.emotion.path"
    if filename is not None and os.fspath(filename) != voice:
        return None
    return "$.voice" if filename is not None or emotion_path is None else None


#: What :func:`next_chunk` returns once upstream's stream is exhausted.
END: Any = object()


def within(context: Decoding, chunks: Iterator[Any]) -> Iterator[Any]:
    """``chunks``, each ``next`` run under ``context`` (upstream's model calls happen inside them)."""
    try:
        while True:
            with decoding(context):
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def stream_segments(
    chunks: Iterator[Any],
    flavour: Flavour,
    texts: SegmentTexts,
    progress: ProgressFn,
    cancelled: Callable[[], bool],
    prepared: Callable[[], None],
    references: tuple[str, Union[str, None]] = ("", None),
    times: Union[StageTimes, None] = None,
) -> Iterator[Any]:
    """Upstream's stream, segment by segment, with silence between segments only.

    Upstream yields each segment followed by ``interval_silence`` of silence, the last
    one too (and with ``interval_silence=0`` it yields its list of segments where the
    silence belongs).  A silence is held back until the next segment arrives, so the
    result matches upstream's non-streaming output sample for sample.
    """
    tally = Tally(flavour, texts)
    index = 0
    try:
        while True:
            if cancelled():
                raise Cancelled
            is_silence = flavour.silence_after_each and index % 2 == 1
            chunk = next_chunk(chunks, index, tally.segments, is_silence, progress, references, times)
            if chunk is END:
                break
            index += 1
            if index == 1:
                prepared()
            if cancelled():
                raise Cancelled
            if is_silence:
                tally.held = None if isinstance(chunk, (list, tuple)) else chunk
            else:
                yield from tally.segment(chunk, progress)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    progress("synthesize", 1.0, f"{tally.segments} segments, {tally.seconds:.2f} s of audio")


def next_chunk(
    chunks: Iterator[Any],
    index: int,
    segments: int,
    is_silence: bool,
    progress: ProgressFn,
    references: tuple[str, Union[str, None]],
    times: Union[StageTimes, None],
) -> Any:
    """Upstream's next item (``END`` when the stream ends), with a heartbeat while it computes.

    The first ``next`` is where upstream prepares the references, lazily: its errors are
    reported as such, naming the clip when they say which.
    """
    if index == 0:
        stage, message = "prepare", "preparing the references and the first segment"
    else:
        stage, message = "synthesize", f"generating segment {segments + 1}"
    if not is_silence:
        progress(stage, None, message)
    capture = times.capturing() if times is not None else contextlib.nullcontext()
    with heartbeat(progress, stage, None, message, HEARTBEAT_INTERVAL), capture:
        try:
            return next(chunks)
        except StopIteration:
            return END
        except Exception as exc:
            if index == 0:
                voice, emotion_path = references
                raise EngineError(
                    f"preparing the references failed: {type(exc).__name__}: {exc}",
                    field=failed_reference(exc, voice, emotion_path),
                ) from exc
            raise


def check_rate(rate: Any) -> None:
    """Refuse audio that is not at upstream's rate: this sidecar does not resample."""
    if int(rate) != NATIVE_SAMPLE_RATE:
        raise EngineError(
            f"the model returned {rate} Hz audio, not {NATIVE_SAMPLE_RATE} Hz; this sidecar does not resample",
            code="internal",
        )

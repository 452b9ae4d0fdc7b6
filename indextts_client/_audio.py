"""Audio results: :class:`Audio` (a whole request) and :class:`AudioChunk` (one streamed frame).

Samples are int16 mono, little-endian as on the wire.  A finished request's audio is
assembled with exactly one copy: the decoded ``pcm`` views of the ``audio`` frames are
kept until ``done``, checked, then copied once into the final array, each one dropped
as soon as it is copied, so peak memory stays near one times the audio.
"""

from __future__ import annotations

import io
import logging
import os
import wave
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar, Union

import numpy as np
import numpy.typing as npt

from indextts_sidecar.protocol import WordSpan
from indextts_sidecar.protocol.segments import read_segment

from ._exceptions import ProtocolError

__all__ = [
    "FORMATS",
    "SAMPLE_DTYPE",
    "Audio",
    "AudioAssembler",
    "AudioChunk",
    "HasSamples",
    "TextSegment",
    "WordTiming",
    "format_for_path",
    "format_of",
    "import_soundfile",
]

log = logging.getLogger(__name__)

#: Little-endian int16: the wire format and the dtype of every ``samples`` array.
SAMPLE_DTYPE = np.dtype("<i2")

Samples = npt.NDArray[np.int16]
T = TypeVar("T")


class HasSamples:
    """Length and duration of anything with ``samples`` at ``sample_rate``."""

    samples: Samples
    sample_rate: int

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return len(self.samples) / self.sample_rate if self.sample_rate else 0.0

    def __len__(self) -> int:
        return len(self.samples)


@dataclass(frozen=True)
class TextSegment:
    """The text one of the engine's segments speaks, as the engine announced it.

    ``text`` is the segment's words.  Where the engine cut its segments from the request's
    text as it is (espeak: a sentence each; the fake engine), ``span`` gives their place in
    it as ``(start, end)`` offsets, ``text == request_text[start:end]``.  IndexTTS cuts its
    segments from the text as its normaliser rewrote it (numbers spelled out, punctuation
    mapped, IndexTTS-2 upper-cases): ``text`` is that text and ``span`` is None.
    """

    #: 0, 1, ...: the order the engine announced its segments in.
    index: int
    text: str
    span: Union[tuple[int, int], None] = None


@dataclass(frozen=True)
class WordTiming:
    """When one word of a request's text is spoken.

    ``word`` is the text it speaks: ``text[span[0]:span[1]]`` of the request's text, or,
    for a segment stand-in, the segment's text.  ``span`` is its place in the request's
    text as ``(start, end)`` character offsets; None where the engine spoke its own text
    (IndexTTS's normalised segments).  ``start`` and ``end`` are seconds from the request's
    first sample.  ``segment`` is True when the entry stands for a whole engine segment,
    because the engine gives no word timings (it lacks the ``word_timings`` capability).
    """

    word: str
    span: Union[tuple[int, int], None]
    start: float
    end: float
    segment: bool = False


def word_timings(
    spans: Sequence[WordSpan], text: str, sample_rate: int, request_id: int = 0, *, warn: bool = True
) -> tuple[WordTiming, ...]:
    """The sidecar's word spans (characters of ``text``, samples at ``sample_rate``) as timings.

    A span the sidecar got wrong (characters outside ``text``, an end before its start, a
    negative sample) is dropped, with a warning if ``warn``: the audio stays good without it.
    """
    size = len(text)
    out = []
    bad = 0
    for span in spans:
        start_char, end_char, start, end = span.start_char, span.end_char, span.start, span.end
        if not (0 <= start_char <= end_char <= size and 0 <= start <= end) or sample_rate <= 0:
            bad += 1
            continue
        word = text[start_char:end_char]
        out.append(
            built(
                WordTiming,
                word=word,
                span=(start_char, end_char),
                start=start / sample_rate,
                end=end / sample_rate,
                segment=False,
            )
        )
    if bad and warn:
        log.warning(
            "request %d: dropped %d of %d word timings the sidecar sent that do not fit its text of %d "
            "characters (or end before they start)",
            request_id,
            bad,
            len(spans),
            size,
        )
    return tuple(out)


def built(cls: type[T], **fields: Any) -> T:
    """``cls(**fields)`` for a frozen dataclass given every field, written into its ``__dict__`` at
    once instead of one frozen ``object.__setattr__`` each (half the cost): for what is made per word
    and per request.  tests/client/test_word_timings.py keeps it equal to the constructors."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made


@dataclass(frozen=True, eq=False)
class AudioChunk(HasSamples):
    """One ``audio`` frame as it arrived.

    ``samples`` is a read-only view into the received frame (no copy); copy it to keep
    a writable array.  ``offset_samples`` is the position of its first sample in the
    request's audio.
    """

    samples: Samples
    sample_rate: int
    seq: int
    offset_samples: int
    request_id: int = 0
    #: The engine segment this chunk belongs to and the text it speaks, where the engine says
    #: (the fake, espeak and IndexTTS engines do); else None.
    segment: Union[TextSegment, None] = None
    #: The words the sidecar sent with this chunk: those whose first sample is in it or
    #: before it and that no earlier chunk carried (engines with the ``word_timings``
    #: capability); seconds from the request's first sample.  Empty otherwise.
    words: tuple[WordTiming, ...] = ()

    @property
    def text_span(self) -> Union[tuple[int, int], None]:
        """The part of the request's text this chunk speaks, as ``text[start:end]`` offsets,
        where the engine gives offsets (the fake and espeak engines do; IndexTTS gives its own
        text instead: see :attr:`segment`); else None."""
        return self.segment.span if self.segment is not None else None

    @property
    def last_sample(self) -> int:
        """The position of its last sample in the request's audio (``offset_samples - 1`` when empty)."""
        return self.offset_samples + len(self.samples) - 1

    def __repr__(self) -> str:
        return (
            f"AudioChunk(request_id={self.request_id}, seq={self.seq}, samples={len(self.samples)}, "
            f"offset_samples={self.offset_samples}, sample_rate={self.sample_rate})"
        )


@dataclass(frozen=True, eq=False)
class Audio(HasSamples):
    """The audio of a finished request: int16 mono ``samples`` at ``sample_rate`` Hz.

    ``timings`` holds the sidecar's seconds per phase (``queued``, ``load``,
    ``first_audio``, ``synthesis``, ``total``).  ``samples`` is always writable.
    """

    samples: Samples
    sample_rate: int
    timings: dict[str, float] = field(default_factory=dict)
    request_id: int = 0
    #: The engine's facts about the request (``voice_cache``: ``hit``/``miss``...).
    facts: dict[str, Any] = field(default_factory=dict)
    #: Every word of the request, in order; for an engine without the ``word_timings``
    #: capability one ``segment=True`` entry per segment it announced.
    words: tuple[WordTiming, ...] = ()

    @property
    def queue_wait(self) -> Union[float, None]:
        """Seconds the request waited in the sidecar's queue (``timings["queued"]``), if known."""
        return self.timings.get("queued")

    @property
    def time_to_first_audio(self) -> Union[float, None]:
        """Seconds from the sidecar queueing the request to its first audio, if known."""
        return self.timings.get("first_audio")

    @property
    def real_time_factor(self) -> Union[float, None]:
        """The sidecar's total seconds over the audio's duration (below 1: faster than real time)."""
        total = self.timings.get("total")
        return None if total is None or not self.duration else total / self.duration

    def __repr__(self) -> str:
        return (
            f"Audio(request_id={self.request_id}, samples={len(self.samples)}, "
            f"sample_rate={self.sample_rate}, duration={self.duration:.3f})"
        )

    def as_float32(self) -> npt.NDArray[np.float32]:
        """A new float32 array in [-1, 1): ``samples / 32768`` (exact, no clipping)."""
        out = self.samples.astype(np.float32)
        out *= np.float32(1.0 / 32768.0)
        return out

    def to_wav(self, file: Union[str, os.PathLike[str], IO[bytes]]) -> None:
        """Write a 16-bit mono WAV file to a path or a binary file object (stdlib :mod:`wave`)."""
        if isinstance(file, (str, os.PathLike)):
            # Opened here, not by wave: a path that cannot be opened raises before a writer exists.
            with open(file, "wb") as out:
                self._write_wav(out)
        else:
            self._write_wav(file)

    def _write_wav(self, file: IO[bytes]) -> None:
        data = np.ascontiguousarray(self.samples, dtype=SAMPLE_DTYPE)
        with wave.open(file, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(self.sample_rate)
            out.setnframes(len(data))
            out.writeframes(data.data.cast("B"))

    def to_bytes(self, format: str = "wav") -> bytes:
        """The audio as a file's bytes: ``"wav"`` always; ``"flac"`` and ``"ogg"`` (Vorbis) with soundfile."""
        buffer = io.BytesIO()
        self._write(buffer, format_of(format))
        return buffer.getvalue()

    def to_file(self, file: Union[str, os.PathLike[str], IO[bytes]], format: Union[str, None] = None) -> None:
        """Write the audio to a path or binary file, in ``format`` or the one the path's suffix names.

        ``.wav`` always works; ``.flac`` and ``.ogg``/``.oga`` (Vorbis) need soundfile (the
        ``audio`` extra).  An unknown suffix raises ``ValueError`` before anything is written.
        """
        if format is None:
            if not isinstance(file, (str, os.PathLike)):
                raise ValueError("give format= when writing to a file object")
            chosen = format_for_path(file)
        else:
            chosen = format_of(format)
        if chosen != "wav":
            import_soundfile()  # fail before creating the file
        if isinstance(file, (str, os.PathLike)):
            with open(file, "wb") as out:
                self._write(out, chosen)
        else:
            self._write(file, chosen)

    def _write(self, file: IO[bytes], format: str) -> None:
        if format == "wav":
            self._write_wav(file)
            return
        soundfile = import_soundfile()
        data = np.ascontiguousarray(self.samples, dtype=SAMPLE_DTYPE)
        subtype = "PCM_16" if format == "flac" else "VORBIS"
        soundfile.write(file, data, self.sample_rate, format=format.upper(), subtype=subtype)


#: File formats by suffix; WAV needs nothing, the others soundfile.
FORMATS = {".wav": "wav", ".wave": "wav", ".flac": "flac", ".ogg": "ogg", ".oga": "ogg"}


def format_of(name: str) -> str:
    """``"WAV"``, ``"flac"``... as one of ``wav``, ``flac``, ``ogg``; ``ValueError`` otherwise."""
    chosen = name.lower().lstrip(".")
    if chosen not in set(FORMATS.values()):
        raise ValueError(f"unknown audio format {name!r}; expected one of wav, flac, ogg")
    return chosen


def format_for_path(path: Union[str, os.PathLike[str]]) -> str:
    """The format a path's suffix names; ``ValueError`` for any other suffix."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    chosen = FORMATS.get(suffix)
    if chosen is None:
        raise ValueError(
            f"cannot tell the audio format of {os.fspath(path)!r} from its suffix; use .wav, .flac or .ogg"
        )
    return chosen


def import_soundfile() -> Any:
    try:
        import soundfile  # type: ignore[import-untyped]
    except (ImportError, OSError) as exc:  # OSError: the wheel's libsndfile failed to load
        raise RuntimeError(
            f"FLAC and Ogg need soundfile: pip install soundfile (the [audio] extra) ({type(exc).__name__}: {exc})"
        ) from exc
    return soundfile


class AudioAssembler:
    """Checks a request's ``audio`` frames as they arrive and assembles them as they come.

    Each frame is copied once, appended to a ``bytearray`` (which grows in place by an
    eighth at a time, with ``realloc``: for large buffers that remaps pages instead of
    copying them, and unlike ``ndarray.resize`` it does not zero the new room first), and
    dropped at once: the peak memory of a long request stays near the audio's own size
    instead of the frames plus a final copy.  A request whose audio arrives in one writable
    frame of its own is not copied at all.  With ``keep=False`` (streaming) only the checks
    run and nothing is retained.
    """

    __slots__ = (
        "_buffer",
        "_dropped_words",
        "_first",
        "_keep",
        "_sample_rate",
        "_segments",
        "chunks",
        "request_id",
        "samples",
        "segment",
        "text",
        "words",
    )

    def __init__(self, request_id: int, *, keep: bool, text: str = "") -> None:
        self.request_id = request_id
        self._keep = keep
        #: The request's text, which word and segment spans point into.
        self.text = text
        #: The only frame so far, kept as it is in case no other follows.
        self._first: Union[memoryview, None] = None
        #: From the second frame on: the samples so far (its allocation has room to grow).
        self._buffer: Union[bytearray, None] = None
        self._sample_rate: Union[int, None] = None
        #: Frames and samples received so far.
        self.chunks = 0
        self.samples = 0
        #: The words the frames carried so far (engines with ``word_timings``).
        self.words: list[WordTiming] = []
        #: The segment the engine announced last (protocol.segments): the coming frames speak it.
        self.segment: Union[TextSegment, None] = None
        #: Whether a word the sidecar sent was dropped (and said so) already.
        self._dropped_words = False
        #: Each announced segment with the position of its first sample.
        self._segments: list[tuple[int, TextSegment]] = []

    def progress(self, stage: str, message: str) -> None:
        """A progress frame: the segment a ``synthesize`` one announces, if any, starts here."""
        if stage != "synthesize" or not message:
            return
        announced = read_segment(message)
        if announced is None:
            return
        current = self.segment
        index = current.index + 1 if current is not None else 0
        if isinstance(announced, str):  # the engine's words: one announcement a segment
            self.segment = TextSegment(index, announced)
        else:
            size = len(self.text)
            span = min(announced[0], size), min(announced[1], size)
            if current is not None and current.span == span:  # the same place again: the same segment
                return
            self.segment = TextSegment(index, self.text[span[0] : span[1]], span)
        self._segments.append((self.samples, self.segment))

    def _check(self, seq: int, sample_rate: int, nbytes: int) -> None:
        if seq != self.chunks:
            raise ProtocolError(f"request {self.request_id}: audio frame seq {seq} arrived, expected {self.chunks}")
        if nbytes % 2:
            raise ProtocolError(
                f"request {self.request_id}: audio frame {seq} holds {nbytes} bytes, not whole int16 samples"
            )
        if self._sample_rate is None:
            self._sample_rate = sample_rate
        elif sample_rate != self._sample_rate:
            raise ProtocolError(
                f"request {self.request_id}: audio frame {seq} is at {sample_rate} Hz, "
                f"earlier ones at {self._sample_rate} Hz"
            )

    def add(self, seq: int, sample_rate: int, pcm: memoryview, words: Sequence[WordSpan] = ()) -> AudioChunk:
        """Record one frame; return it as a chunk (a zero-copy, read-only view) of the current segment."""
        view = pcm.cast("B") if pcm.format != "B" else pcm
        offset = self.samples
        known = len(self.words)
        self.absorb(seq, sample_rate, view, words=words)
        samples = np.frombuffer(view, dtype=SAMPLE_DTYPE)
        samples.flags.writeable = False
        chunk_words = tuple(self.words[known:]) if words else ()
        return AudioChunk(samples, sample_rate, seq, offset, self.request_id, self.segment, chunk_words)

    def absorb(
        self, seq: int, sample_rate: int, pcm: memoryview, *, transient: bool = False, words: Sequence[WordSpan] = ()
    ) -> None:
        """Record one frame, kept for :meth:`assemble` only (no chunk for anyone), and its words.

        ``transient``: ``pcm`` is read over once this returns (the frame reader's buffer),
        so what is kept of it is copied.
        """
        view = pcm.cast("B") if pcm.format != "B" else pcm
        self._check(seq, sample_rate, len(view))
        if words:
            self._add_words(words, sample_rate)
        if self._keep:
            if self._buffer is None and self.chunks == 0 and not transient:
                self._first = view  # perhaps the only frame: keep it as it is
            else:
                if self._buffer is None:  # the frames so far (the first, or none) start the buffer
                    self._buffer = bytearray(self._first if self._first is not None else b"")
                    self._first = None
                self._buffer += view
        self.chunks += 1
        self.samples += len(view) // 2

    def check_done(self, samples: int, chunks: int, sample_rate: int) -> None:
        """Compare the ``done`` frame's totals with what arrived; raise :class:`ProtocolError`."""
        if chunks != self.chunks or samples != self.samples:
            raise ProtocolError(
                f"request {self.request_id}: done reports {samples} samples in {chunks} frames, "
                f"but {self.samples} samples in {self.chunks} frames arrived"
            )
        if self._sample_rate is not None and sample_rate != self._sample_rate:
            raise ProtocolError(
                f"request {self.request_id}: done reports {sample_rate} Hz, the audio frames {self._sample_rate} Hz"
            )

    def _add_words(self, spans: Sequence[WordSpan], sample_rate: int) -> None:
        # One warning a request: a sidecar that gets every frame's words wrong fills no log.
        timings = word_timings(spans, self.text, sample_rate, self.request_id, warn=not self._dropped_words)
        self._dropped_words = self._dropped_words or len(timings) < len(spans)
        self.words.extend(timings)

    def all_words(
        self, sample_rate: int, late: Sequence[WordSpan] = (), *, by_segment: bool = False
    ) -> tuple[WordTiming, ...]:
        """Every word of the request once ``done`` came (``late``: the words it carried).

        ``by_segment`` (an engine without word timings): one stand-in per announced segment,
        from its first sample to the next one's (the last to the end of the audio).
        """
        if late:
            self._add_words(late, sample_rate)
        if self.words or not by_segment or sample_rate <= 0 or not self._segments:
            return tuple(self.words)
        segments = self._segments
        ends = [start for start, _ in segments[1:]] + [self.samples]
        return tuple(
            WordTiming(segment.text, segment.span, start / sample_rate, max(start, end) / sample_rate, segment=True)
            for (start, segment), end in zip(segments, ends, strict=True)
        )

    def assemble(self) -> Samples:
        """The whole audio, as one writable array."""
        first, buffer = self._first, self._buffer
        self._first = self._buffer = None
        if first is not None:
            # The only frame: view it when it is writable, else copy it once.
            samples = np.frombuffer(first, dtype=SAMPLE_DTYPE)
            return samples if not first.readonly else samples.copy()
        if buffer is None:
            return np.empty(0, dtype=SAMPLE_DTYPE)
        return np.frombuffer(buffer, dtype=SAMPLE_DTYPE)

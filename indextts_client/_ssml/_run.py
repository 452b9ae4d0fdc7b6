"""Speaking an SSML text through a client: one request per segment, exact silences between.

:func:`synthesize_ssml` returns one :class:`Audio`; :class:`SsmlSynthesis` is what
``stream(..., text_format="ssml")`` and ``request(...)`` return: the same chunks as a plain
stream would give, numbered and placed as one request's (``seq``, ``offset_samples``), with a
chunk of silence for each break.  Word timings and segment spans point into the SSML source.
Everything is read and rendered, and refused if it must be, before the first request is sent.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Protocol, Union

import anyio
import numpy as np

from .._audio import SAMPLE_DTYPE, Audio, AudioChunk, TextSegment, WordTiming
from .._exceptions import RequestTimeoutError
from .._types import LoadInfo, ProgressEvent, SidecarInfo
from .._wire._request_run import Synthesis
from ._parse import SsmlLimits, parse_ssml
from ._plan import Silence
from ._render import Segment, render


class Speaker(Protocol):
    """What runs the segments: a Client's or Connection's request methods."""

    async def synthesize(self, text: str, **kwargs: Any) -> Audio: ...

    async def load(self) -> LoadInfo: ...

    def stream(self, text: str, **kwargs: Any) -> Synthesis: ...


__all__ = ["Speaker", "SsmlSynthesis", "plan_for", "synthesize_ssml"]


@dataclass(frozen=True)
class _Plan:
    source: str
    steps: list[Union[Segment, Silence]]
    sample_rate: Union[int, None]


def plan_for(
    info: SidecarInfo,
    source: str,
    *,
    strict: bool,
    max_silence: float,
    voice: Union[str, None],
    sample_rate: Union[int, None],
    options: Mapping[str, Any],
) -> _Plan:
    """Read ``source`` and render it for the engine of ``info`` (its ``ready`` frame), or raise SsmlError."""
    if not math.isfinite(max_silence) or max_silence < 0:
        raise ValueError(f"max_silence must be a number of seconds >= 0, got {max_silence!r}")
    plan = parse_ssml(source, strict=strict, limits=SsmlLimits(max_silence=max_silence))
    steps = render(plan, info.engine, info.speed, strict=strict, voice=voice, options=options)
    return _Plan(source, steps, sample_rate or info.sample_rate)


def _words(words: tuple[WordTiming, ...], segment: Segment, shift: float) -> list[WordTiming]:
    out = []
    for word in words:
        span = segment.source_span(*word.span) if word.span is not None else None
        out.append(replace(word, span=span, start=word.start + shift, end=word.end + shift))
    return out


def _silence(samples: int) -> np.ndarray[Any, np.dtype[np.int16]]:
    return np.zeros(samples, dtype=SAMPLE_DTYPE)


async def _rate(requester: Speaker, plan: _Plan) -> int:
    """The output rate for a silence before any audio said it: asked, or known before loading, or the load's."""
    if plan.sample_rate is not None:
        return plan.sample_rate
    loaded = await requester.load()
    assert loaded.sample_rate is not None
    return loaded.sample_rate


class _Deadline:
    def __init__(self, timeout: Union[float, None]) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else anyio.current_time() + timeout

    def left(self) -> Union[float, None]:
        if self.at is None:
            return None
        left = self.at - anyio.current_time()
        if left <= 0:
            raise RequestTimeoutError(
                f"request did not finish within {self.timeout} s", deadline="timeout", seconds=self.timeout or 0.0
            )
        return left


def _timings(audios: list[Audio]) -> dict[str, float]:
    """The first request's wait and first audio; the sum of the rest."""
    timings: dict[str, float] = {}
    for index, audio in enumerate(audios):
        for name, value in audio.timings.items():
            if name in ("queued", "first_audio", "load") and index:
                continue
            timings[name] = timings.get(name, 0.0) + value
    return timings


async def synthesize_ssml(
    requester: Speaker, plan: _Plan, limit: Union[float, None], request: Mapping[str, Any]
) -> Audio:
    """Every segment of ``plan`` through ``requester.synthesize``, silences between: one Audio.

    ``limit`` (``synthesize``'s ``timeout``) bounds the whole: each segment's request gets what is
    left of it; ``request``
    holds the other arguments every segment's request takes (emotion, sample_rate...).
    """
    deadline = _Deadline(limit)
    parts: list[np.ndarray[Any, np.dtype[np.int16]]] = []
    words: list[WordTiming] = []
    early: list[Silence] = []  # silences before the rate is known
    rate = plan.sample_rate
    size = 0
    audios: list[Audio] = []
    for step in plan.steps:
        if isinstance(step, Silence):
            if rate is None:
                early.append(step)
            else:
                parts.append(_silence(step.samples(rate)))
                size += len(parts[-1])
            continue
        audio = await requester.synthesize(
            step.text, voice=step.voice, timeout=deadline.left(), **request, **dict(step.options)
        )
        if rate is None:
            rate = audio.sample_rate
            parts.append(_silence(sum(silence.samples(rate) for silence in early)))
            size += len(parts[-1])
            early = []
        words.extend(_words(audio.words, step, size / rate))
        parts.append(audio.samples)
        size += len(audio.samples)
        audios.append(audio)
    if rate is None:  # breaks only
        rate = await _rate(requester, plan)
        parts.append(_silence(sum(silence.samples(rate) for silence in early)))
    samples = np.concatenate(parts) if parts else _silence(0)
    first = audios[0] if audios else None
    return Audio(
        samples,
        rate,
        _timings(audios),
        first.request_id if first is not None else 0,
        facts=dict(first.facts) if first is not None else {},
        words=tuple(words),
    )


class SsmlSynthesis(Synthesis):
    """``stream(..., text_format="ssml")`` and ``request(...)``: a :class:`Synthesis` over several requests.

    Its chunks are the segments' chunks, renumbered (``seq``) and placed (``offset_samples``) as
    one request's, with their segment spans and words pointing into the SSML source, and a chunk
    of silence (``segment`` None) for each break.  Nothing is sent before ``async with`` (or
    :meth:`start`); leaving it early cancels the segment being spoken and sends no other.
    """

    def __init__(
        self,
        speaker: Speaker,
        plan: _Plan,
        *,
        keep_audio: bool,
        limit: Union[float, None],
        request: Mapping[str, Any],
        whole: bool = False,
    ) -> None:
        # Not Synthesis.__init__: nothing of its own exchange; the segments' streams do the work.
        self._speaker = speaker
        self._plan = plan
        self._keep = keep_audio
        self._limit = limit
        self._request = dict(request)
        #: synthesize()'s: each segment through the speaker's synthesize(), no chunks handed out.
        self._whole = whole
        self._items: Union[AsyncIterator[Union[ProgressEvent, AudioChunk]], None] = None
        self._ended = False
        self._owned = False
        self._parts: list[np.ndarray[Any, np.dtype[np.int16]]] = []
        self._rate: Union[int, None] = plan.sample_rate
        self._first_id: Union[int, None] = None
        self._audio: Union[Audio, None] = None
        self.timings: dict[str, float] = {}
        self.facts: dict[str, Any] = {}
        self.words: tuple[WordTiming, ...] = ()

    @property
    def request_id(self) -> Union[int, None]:
        """The id of the first segment's request (None before it is sent)."""
        return self._first_id

    @property
    def finished(self) -> bool:
        return self._ended

    async def start(self) -> None:
        self._owned = True
        if self._items is None and not self._whole:
            self._items = self._produce()

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        await self.aclose()

    async def _step(self) -> Union[ProgressEvent, AudioChunk, None]:
        """The next event of the segments, in order (silences as chunks); None once they ended.
        Synthesis's iteration, ``events()`` and ``result()`` step through it."""
        if self._ended:
            return None
        if self._items is None:
            raise RuntimeError("start the stream first: 'async with client.stream(..., text_format=\"ssml\")'")
        try:
            return await self._items.__anext__()
        except StopAsyncIteration:
            self._ended = True
            return None

    async def result(self) -> Audio:
        if not self._keep:
            raise RuntimeError("a stream() keeps no audio; use request() or synthesize() for a whole result")
        if self._whole and self._audio is None:
            self._audio = await synthesize_ssml(self._speaker, self._plan, self._limit, self._request)
            self.timings, self.facts, self.words = self._audio.timings, self._audio.facts, self._audio.words
            self._first_id, self._ended = self._audio.request_id, True
        while await self._step() is not None:
            pass
        assert self._audio is not None
        return self._audio

    async def whole(self) -> Audio:
        async with self:
            return await self.result()

    async def aclose(self) -> None:
        items, self._items = self._items, None
        self._ended = True
        if items is not None:
            await items.aclose()  # type: ignore[attr-defined]

    def _chunk(self, samples: Any, rate: int, seq: int, offset: int, **more: Any) -> AudioChunk:
        if self._keep:
            self._parts.append(np.array(samples, dtype=SAMPLE_DTYPE))
        return AudioChunk(samples, rate, seq, offset, self._first_id or 0, **more)

    async def _produce(self) -> AsyncIterator[Union[ProgressEvent, AudioChunk]]:
        deadline = _Deadline(self._limit)
        early: list[Silence] = []
        seq = offset = 0
        index = 0  # the segments' numbering, continued across requests
        words: list[WordTiming] = []
        audios: list[Audio] = []
        for step in self._plan.steps:
            if isinstance(step, Silence):
                if self._rate is None:
                    early.append(step)
                    continue
                samples = step.samples(self._rate)
                if samples:
                    yield self._chunk(_silence(samples), self._rate, seq, offset)
                    seq, offset = seq + 1, offset + samples
                continue
            inner = self._speaker.stream(
                step.text, voice=step.voice, timeout=deadline.left(), **self._request, **dict(step.options)
            )
            base, top = index, index
            start: Union[int, None] = None  # where this segment's audio starts
            async with inner:
                async for item in inner.events():
                    if self._first_id is None:
                        self._first_id = inner.request_id
                    if not isinstance(item, AudioChunk):
                        yield item
                        continue
                    if self._rate is None:
                        self._rate = item.sample_rate
                        samples = sum(silence.samples(self._rate) for silence in early)
                        if samples:
                            yield self._chunk(_silence(samples), self._rate, seq, offset)
                            seq, offset = seq + 1, offset + samples
                    if start is None:
                        start = offset - item.offset_samples
                    segment = item.segment
                    if segment is not None:
                        top = max(top, base + segment.index + 1)
                        span = step.source_span(*segment.span) if segment.span is not None else None
                        segment = TextSegment(base + segment.index, segment.text, span)
                    yield self._chunk(
                        item.samples,
                        item.sample_rate,
                        seq,
                        offset,
                        segment=segment,
                        words=tuple(_words(item.words, step, start / item.sample_rate)),
                    )
                    seq, offset = seq + 1, offset + len(item.samples)
            index = top
            if self._rate is not None:
                words.extend(_words(inner.words, step, (offset if start is None else start) / self._rate))
            audios.append(Audio(_silence(0), self._rate or 1, dict(inner.timings), facts=dict(inner.facts)))
        if self._rate is None:  # breaks only
            self._rate = await _rate(self._speaker, self._plan)
            samples = sum(silence.samples(self._rate) for silence in early)
            if samples:
                yield self._chunk(_silence(samples), self._rate, seq, offset)
        self.timings = _timings(audios)
        self.facts = dict(audios[0].facts) if audios else {}
        self.words = tuple(words)
        if self._keep:
            self._audio = Audio(
                np.concatenate(self._parts) if self._parts else _silence(0),
                self._rate,
                self.timings,
                self._first_id or 0,
                facts=self.facts,
                words=self.words,
            )
        self._ended = True

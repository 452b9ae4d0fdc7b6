"""Speaking an SSML text through a client: one request per segment, exact silences between.

:func:`synthesize_ssml` returns one :class:`Audio`; :class:`SsmlSynthesis` is what
``stream(..., text_format="ssml")`` and ``request(...)`` return: the same chunks as a plain
stream would give, numbered and placed as one request's (``seq``, ``offset_samples``), with a
chunk of silence for each break.  Word timings and segment spans point into the SSML source.
Everything is read and rendered, and refused if it must be, before the first request is sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, Union

import anyio
import numpy as np

from .._audio import SAMPLE_DTYPE, Audio, WordTiming
from .._exceptions import RequestTimeoutError
from .._types import LoadInfo, SidecarInfo
from ._parse import SsmlLimits, parse_ssml
from ._plan import Silence
from ._render import Segment, render


class Speaker(Protocol):
    """What runs the segments: a Client's or Connection's request methods."""

    async def synthesize(self, text: str, **kwargs: Any) -> Audio: ...

    async def load(self) -> LoadInfo: ...


__all__ = ["Speaker", "plan_for", "synthesize_ssml"]


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

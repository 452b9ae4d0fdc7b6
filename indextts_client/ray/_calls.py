"""Calls on Ray Serve handles from asyncio or trio, and the stream a :class:`RayClient` caller reads.

Ray's handles are asyncio objects: on trio a call waits in a worker thread (abandoned, and the
Ray call cancelled, when the caller is cancelled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Union

import anyio
import msgspec
import numpy as np
from ray.exceptions import RayActorError

from .._audio import SAMPLE_DTYPE, AudioChunk, WordTiming
from .._exceptions import CrashedError, RestartLimitError, StartError

__all__ = [
    "RETRYABLE",
    "RayStream",
    "StreamChunk",
    "StreamEnd",
    "SynthesisResult",
    "lost",
    "next_item",
    "resolved",
    "word_rows",
    "words_from_rows",
]

log = logging.getLogger("indextts_client")


#: A word timing as the replica sends it: word, span (None or [start, end]), start, end, segment.
WordRow = list[Any]


class StreamChunk(msgspec.Struct, frozen=True, tag="chunk"):
    """One audio chunk of a replica's stream."""

    samples: bytes
    sample_rate: int
    seq: int
    offset_samples: int
    words: list[WordRow] = []


class StreamEnd(msgspec.Struct, frozen=True, tag="end"):
    """A replica's stream's last item: what the caller reads off a finished stream (every word,
    segment stand-ins included, which no chunk carries)."""

    words: list[WordRow]
    timings: dict[str, float]
    facts: dict[str, Any]


class SynthesisResult(msgspec.Struct, frozen=True):
    """A replica's answer to ``synthesize``: the whole audio and what the sidecar said of it."""

    samples: bytes
    sample_rate: int
    timings: dict[str, float]
    facts: dict[str, Any]
    words: list[WordRow]
    pid: Union[int, None]


class RayStream:
    """:meth:`RayClient.stream`'s stream: ``async with stream as chunks``; after its end, the
    request's ``words`` (as :attr:`Audio.words`), ``timings`` and ``facts`` as the replica saw them."""

    def __init__(self, handle: Any, text: str, kwargs: dict[str, Any], retries: int) -> None:
        self._handle, self._text, self._kwargs, self._retries = handle, text, kwargs, retries
        self._current: Union[Any, None] = None
        self._iterator: Union[AsyncIterator[AudioChunk], None] = None
        self.words: tuple[WordTiming, ...] = ()
        self.timings: dict[str, float] = {}
        self.facts: dict[str, Any] = {}
        #: Behind Ray no pool member comes back (a :class:`~indextts_client._service.ServedStream`'s).
        self.member_index: Union[int, None] = None

    async def __aenter__(self) -> AsyncIterator[AudioChunk]:
        if self._iterator is not None:
            raise RuntimeError("a RayStream is entered once")
        self._current = self._handle.stream.remote(self._text, **self._kwargs)
        self._iterator = self._chunks()
        return self._iterator

    async def __aexit__(self, *exc_info: object) -> None:
        if self._iterator is not None:
            await self._iterator.aclose()  # type: ignore[attr-defined]
        if self._current is not None:
            self._current.cancel()

    async def _chunks(self) -> AsyncIterator[AudioChunk]:
        delivered = 0
        attempt = 0
        while True:
            try:
                item = await next_item(self._current)
            except RETRYABLE as exc:
                assert self._current is not None
                self._current.cancel()
                if delivered or attempt == self._retries:
                    if isinstance(exc, RayActorError):
                        raise CrashedError(lost(exc, delivered)) from exc
                    raise
                attempt += 1
                log.warning("a stream lost its replica before any audio (%s); sending it again", type(exc).__name__)
                self._current = self._handle.stream.remote(self._text, **self._kwargs)
                continue
            match item:
                case None:
                    return
                case StreamEnd():
                    self.words = words_from_rows(item.words)
                    self.timings, self.facts = dict(item.timings), dict(item.facts)
                case StreamChunk():
                    delivered += 1
                    yield AudioChunk(
                        samples=np.frombuffer(item.samples, dtype=SAMPLE_DTYPE),
                        sample_rate=item.sample_rate,
                        seq=item.seq,
                        offset_samples=item.offset_samples,
                        words=words_from_rows(item.words),
                    )
                case _:
                    raise TypeError(f"a replica's stream sent a {type(item).__name__}, not a chunk or its end")


def word_rows(words: tuple[WordTiming, ...]) -> list[WordRow]:
    """Word timings as plain lists, for Ray's serializer (compact, and no class to import)."""
    return [[w.word, None if w.span is None else list(w.span), w.start, w.end, w.segment] for w in words]


def words_from_rows(rows: list[WordRow]) -> tuple[WordTiming, ...]:
    """The replica's word rows as timings."""
    if not rows:
        return ()
    return tuple(
        WordTiming(
            str(word), None if span is None else (int(span[0]), int(span[1])), float(start), float(end), bool(seg)
        )
        for word, span, start, end, seg in rows
    )


_END = object()
#: Failures after which a request that delivered nothing may run on another replica: its
#: actor or node died (Ray), or its sidecar crashed or could not start (the replica's Client).
RETRYABLE = (RayActorError, CrashedError, RestartLimitError, StartError)


def lost(exc: BaseException, delivered: int) -> str:
    """Why a request failed whose replica Ray lost (a dead actor or node): raised as
    :class:`CrashedError`, the error a Pool gives when its member dies."""
    after = f" after {delivered} chunks of audio" if delivered else ""
    return f"the Ray Serve replica serving the request was lost{after}: {type(exc).__name__}: {exc}"


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def resolved(response: Any) -> Any:
    """Await a DeploymentResponse on asyncio, or in a worker thread on trio; cancel it if we are."""
    if _on_asyncio():
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise
    try:
        return await anyio.to_thread.run_sync(response.result, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        response.cancel()
        raise


async def next_item(response: Any) -> Any:
    """The next item of a DeploymentResponseGenerator, or None at its end."""
    if _on_asyncio():
        try:
            return await response.__anext__()
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            response.cancel()
            raise
    try:
        item = await anyio.to_thread.run_sync(lambda: next(response, _END), abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        response.cancel()
        raise
    return None if item is _END else item

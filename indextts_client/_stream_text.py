"""``stream_text``: text fragments in (an LLM's tokens), one ordered stream of audio out.

::

    async with client.stream_text(llm_tokens(), voice="alice.wav") as chunks:
        async for chunk in chunks:          # SentenceChunk: samples, sentence, text, seq
            play(chunk.samples)

A task of the stream reads the fragments and cuts sentences as they complete (with
``sentence-stream``'s detector, the splitter Home Assistant's own TTS servers use, extra
``[realtime]``, kept linear in the text by :class:`~._sentences.SentenceSplitter`; a large
fragment is split in a worker thread, off the event loop).  Each sentence is sent to the sidecar as one
streamed request the moment it is cut, up to ``lookahead`` sentences ahead of the one
being delivered, so the engine's queue already holds the next sentence when the current
one ends: the engine never waits for the caller.  The caller reads the sentences' audio
in order, each chunk tagged with its sentence's index and text.

Leaving the ``async with`` block (a ``break``, an error, a cancel) cancels the sentence
being synthesized and every queued one on the sidecar at once, and stops reading the
fragments.  :data:`FLUSH` among the fragments (or their end) speaks what is left, sentence
end or not: the end of a turn.

Push-style callers (a server receiving text over a socket) feed a :class:`TextFeed`;
one stream per context of a connection.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar, Union

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._audio import AudioChunk, HasSamples, Samples, WordTiming
from ._sentences import PIECE, SentenceSplitter
from ._ssml._cut import SsmlSplitter
from ._types import ServedStream

__all__ = [
    "FLUSH",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_MAX_SENTENCE_CHARS",
    "Flush",
    "SentenceChunk",
    "SentenceEnd",
    "SentenceOpener",
    "TextFeed",
    "TextStream",
    "TextInput",
]

#: Sentences sent to the sidecar beyond the one being delivered.
DEFAULT_LOOKAHEAD: Final = 2
#: Text without a sentence end longer than this is cut at its last space before it.
DEFAULT_MAX_SENTENCE_CHARS: Final = 1000


class Flush:
    """The type of :data:`FLUSH`."""

    _instance: Union[Flush, None] = None

    def __new__(cls) -> Flush:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "FLUSH"


#: Among the fragments: speak what is left now, without waiting for a sentence end.
FLUSH: Final = Flush()

Fragment = Union[str, Flush]
#: What ``stream_text`` reads: fragments of text (any split, mid-word included), maybe FLUSH.
TextInput = Union[AsyncIterable[Fragment], Iterable[Fragment]]
#: Opens one sentence's streamed request: a :class:`ServedStream` over its audio chunks.
Opener = Callable[[str], ServedStream]


@dataclass(frozen=True)
class SentenceOpener:
    """What a stream's session lends it: how to open a sentence's request, and the pool member
    they run on (None: a client's, or a deployment's, where no member comes back)."""

    open: Opener
    member_index: Union[int, None] = None


@dataclass(frozen=True, eq=False)
class SentenceChunk(HasSamples):
    """One audio chunk of a sentence.

    ``sentence`` counts the stream's sentences from 0; ``text`` is that sentence as the
    engine got it; ``seq`` and ``offset_samples`` count within the sentence (``seq == 0``:
    its first chunk).  ``samples`` is a read-only view, as in :class:`AudioChunk`.
    ``words``: as :attr:`AudioChunk.words`, seconds from the sentence's first sample and
    spans into ``text``.
    """

    samples: Samples
    sample_rate: int
    sentence: int
    text: str
    seq: int
    offset_samples: int
    words: tuple[WordTiming, ...] = ()

    def __repr__(self) -> str:
        return (
            f"SentenceChunk(sentence={self.sentence}, seq={self.seq}, samples={len(self.samples)}, "
            f"offset_samples={self.offset_samples}, sample_rate={self.sample_rate}, text={self.text!r})"
        )


@dataclass(frozen=True)
class SentenceEnd:
    """The end of a sentence's audio (from :meth:`TextStream.events`).

    ``samples``: how many it had; ``flushed``: it was cut by :data:`FLUSH` or by the end
    of the fragments rather than by its own sentence end (the end of a turn).
    """

    sentence: int
    text: str
    samples: int
    flushed: bool
    #: The sentence's request as its ``done`` told (as on :class:`~indextts_client.Audio`): the
    #: sidecar's seconds per phase and the engine's facts; empty where its stream has none (Ray).
    #: (These facts of the request do not take part in ``==``: a sentence's end is its text and audio.)
    timings: Mapping[str, float] = field(default_factory=dict, compare=False)
    facts: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: Seconds from the sentence's request being sent to its first chunk reaching the caller
    #: (None without audio), and to its end: a sentence sent ahead waits for those before it.
    time_to_first_audio: Union[float, None] = field(default=None, compare=False)
    total_time: float = field(default=0.0, compare=False)
    #: The index of the pool member that spoke it; None outside a pool.
    member_index: Union[int, None] = field(default=None, compare=False)
    #: Every word of the sentence, as :attr:`~indextts_client.Audio.words` (seconds from the
    #: sentence's first sample, spans into ``text``; segment stand-ins for an engine without
    #: word timings); empty where its stream has none (Ray).
    words: tuple[WordTiming, ...] = field(default=(), compare=False)


@dataclass
class _Sentence:
    index: int
    text: str
    flushed: bool
    context: ServedStream
    chunks: AsyncIterator[AudioChunk]
    sent_at: float = 0.0  # time.perf_counter() when its request was opened
    first_at: Union[float, None] = None
    samples: int = 0
    seq: int = 0
    closed: bool = False


@dataclass(frozen=True)
class _End:
    error: Union[BaseException, None]


class _Fragments:
    """One async iterator over either kind of iterable (no async generator: a consumer that
    stops early would leave one for the garbage collector to finalize, which trio refuses)."""

    def __init__(self, texts: TextInput) -> None:
        if isinstance(texts, AsyncIterable):
            self._async: Union[AsyncIterator[Fragment], None] = texts.__aiter__()
            self._sync: Union[Iterator[Fragment], None] = None
        else:
            self._async, self._sync = None, iter(texts)

    async def next(self) -> Union[Fragment, None]:
        """The next fragment, None at the end."""
        if self._async is not None:
            try:
                return await self._async.__anext__()
            except StopAsyncIteration:
                return None
        assert self._sync is not None
        await anyio.lowlevel.checkpoint()
        return next(self._sync, None)

    async def aclose(self) -> None:
        close = getattr(self._async, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:  # the source's own cleanup failing is not the stream's error: say so
                logging.getLogger(__name__).warning("stream_text: closing the text source failed", exc_info=True)


class TextStream:
    """What ``stream_text`` returns: ``async with`` it, then iterate its :class:`SentenceChunk`.

    ``session`` gives the opener of one sentence's request for the stream's lifetime (a
    pool's member, held until the end); ``lookahead`` bounds the sentences in flight
    beyond the one being delivered (>= 0; 0 waits for each sentence's end before sending
    the next); ``max_sentence_chars`` bounds the text held waiting for a sentence end.
    """

    def __init__(
        self,
        session: Callable[[], AbstractAsyncContextManager[SentenceOpener]],
        texts: TextInput,
        *,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        text_format: str = "text",
    ) -> None:
        if isinstance(texts, str):
            raise TypeError("stream_text takes an iterable of text fragments, not one str (wrap it: [text])")
        if lookahead < 0:
            raise ValueError("lookahead must be >= 0")
        if max_sentence_chars < 1:
            raise ValueError("max_sentence_chars must be >= 1")
        self._splitter: Union[SentenceSplitter, SsmlSplitter] = SentenceSplitter(max_sentence_chars)
        if text_format == "ssml":  # whole SSML documents, never cut inside a tag or an element
            self._splitter = SsmlSplitter(max_sentence_chars)
        self._session = session
        self._texts = texts
        self._lookahead = lookahead
        self._slots = anyio.Semaphore(lookahead + 1)
        self._send: MemoryObjectSendStream[Union[_Sentence, _End]]
        self._receive: MemoryObjectReceiveStream[Union[_Sentence, _End]]
        self._opened: list[_Sentence] = []
        self._current: Union[_Sentence, None] = None
        self._count = 0
        self._task_group: Union[TaskGroup, None] = None
        self._session_cm: Union[AbstractAsyncContextManager[SentenceOpener], None] = None
        self._opener: Union[SentenceOpener, None] = None
        #: new -> open -> done | failed | closed
        self._state = "new"
        self._failure: Union[BaseException, None] = None

    @property
    def sentences(self) -> int:
        """Sentences cut and sent so far."""
        return self._count

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> TextStream:
        if self._state != "new":
            raise RuntimeError("a stream_text() can be entered once")
        session = self._session()
        self._opener = await session.__aenter__()
        # Unbounded in type only: the semaphore holds it to lookahead + 1 sentences and one end.
        self._send, self._receive = anyio.create_memory_object_stream(math.inf)
        self._session_cm = session
        self._state = "open"
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._produce)
        return self

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> Union[bool, None]:
        if self._state == "open":
            self._state = "closed"
        task_group, self._task_group = self._task_group, None
        try:
            if task_group is not None:
                task_group.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await self._close_all()
                # Its only task (the producer) never raises: the body's own exception, if any,
                # goes on unwrapped once this returns.
                await task_group.__aexit__(None, None, None)
        finally:
            session, self._session_cm = self._session_cm, None
            if session is not None:
                with anyio.CancelScope(shield=True):
                    await session.__aexit__(None, None, None)
        return None

    async def _close_all(self) -> None:
        """Cancel every sentence still open on the sidecar: the current one, then the queued."""
        opened, self._opened = self._opened, []
        for sentence in opened:
            await self._close(sentence)
        self._send.close()
        self._receive.close()

    async def _close(self, sentence: _Sentence) -> None:
        if sentence.closed:
            return
        sentence.closed = True
        try:
            await sentence.context.__aexit__(None, None, None)
        finally:
            self._slots.release()

    # ------------------------------------------------------------ reading the text

    async def _produce(self) -> None:
        """Read the fragments, cut sentences, open a request per sentence; never raises."""
        fragments = _Fragments(self._texts)
        try:
            splitter = self._splitter
            while (piece := await fragments.next()) is not None:
                if isinstance(piece, Flush):
                    # (SSML's cutter holds a flush back while a tag or an element is open)
                    await self._submit(getattr(splitter, "flush", splitter.finish)(), flushed=True)
                    continue
                if not isinstance(piece, str):
                    raise TypeError(f"stream_text fragments are str or FLUSH, not {type(piece).__name__}")
                if len(piece) <= PIECE:
                    sentences = splitter.add(piece)  # a token of an LLM: cheaper here than a thread hop
                else:
                    sentences = await anyio.to_thread.run_sync(splitter.add, piece)
                for sentence in sentences:
                    await self._submit(sentence, flushed=False)
            await self._submit(splitter.finish(), flushed=True)
            self._send.send_nowait(_End(None))
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            try:
                self._send.send_nowait(_End(exc))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
        finally:
            # An async generator left unfinished is closed here, in the task that iterated it,
            # not by the garbage collector.
            with anyio.CancelScope(shield=True):
                await fragments.aclose()

    async def _submit(self, text: str, *, flushed: bool) -> None:
        text = text.strip()
        if not text:
            return
        assert self._opener is not None
        await self._slots.acquire()
        sent_at = time.perf_counter()
        try:
            context = self._opener.open(text)
            chunks = await context.__aenter__()
        except BaseException:
            self._slots.release()
            raise
        sentence = _Sentence(self._count, text, flushed, context, chunks, sent_at)
        self._count += 1
        self._opened.append(sentence)
        self._send.send_nowait(sentence)

    # ------------------------------------------------------------ delivering the audio

    def __aiter__(self) -> _Chunks:
        self._check_open()
        return _Chunks(self._next)

    def events(self) -> _Events:
        """The chunks, with a :class:`SentenceEnd` after each sentence's last one."""
        self._check_open()
        return _Events(self._next)

    def _check_open(self) -> None:
        if self._state == "new":
            raise RuntimeError(
                "iterate inside 'async with client.stream_text(...) as chunks:', so that leaving "
                "the loop cancels the sentences still queued"
            )

    async def next_event(self) -> Union[SentenceChunk, SentenceEnd, None]:
        """The next chunk or sentence end; None once every sentence has been delivered."""
        self._check_open()
        return await self._next()

    async def _next(self) -> Union[SentenceChunk, SentenceEnd, None]:
        if self._state == "done":
            return None
        if self._state == "failed":
            assert self._failure is not None
            raise self._failure
        if self._state == "closed":
            raise anyio.ClosedResourceError("the stream_text() was closed")
        try:
            return await self._advance()
        except BaseException as exc:
            if isinstance(exc, Exception):
                self._state, self._failure = "failed", exc
            raise

    async def _advance(self) -> Union[SentenceChunk, SentenceEnd, None]:
        current = self._current
        if current is None:
            item = await self._receive.receive()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                self._state = "done"
                return None
            current = self._current = item
        try:
            chunk = await current.chunks.__anext__()
        except StopAsyncIteration:
            self._current = None
            if current in self._opened:
                self._opened.remove(current)
            with anyio.CancelScope(shield=True):
                await self._close(current)
            return self._end_of(current)
        if current.first_at is None:
            current.first_at = time.perf_counter()
        result = SentenceChunk(
            samples=chunk.samples,
            sample_rate=chunk.sample_rate,
            sentence=current.index,
            text=current.text,
            seq=current.seq,
            offset_samples=current.samples,
            words=chunk.words,
        )
        current.seq += 1
        current.samples += len(chunk.samples)
        return result

    def _end_of(self, sentence: _Sentence) -> SentenceEnd:
        first = None if sentence.first_at is None else sentence.first_at - sentence.sent_at
        return SentenceEnd(
            sentence.index,
            sentence.text,
            sentence.samples,
            sentence.flushed,
            timings=dict(sentence.context.timings),
            facts=dict(sentence.context.facts),
            time_to_first_audio=first,
            total_time=time.perf_counter() - sentence.sent_at,
            member_index=None if self._opener is None else self._opener.member_index,
            words=sentence.context.words,
        )


#: A :class:`TextStream`'s next chunk or sentence end (None: the stream ended).
_NextItem = Callable[[], Awaitable[Union[SentenceChunk, SentenceEnd, None]]]


class _Events:
    """An async iterator over a :class:`TextStream`'s chunks and sentence ends."""

    def __init__(self, next_item: _NextItem) -> None:
        self._next_item = next_item

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Union[SentenceChunk, SentenceEnd]:
        item = await self._next_item()
        if item is None:
            raise StopAsyncIteration
        return item


class _Chunks:
    """An async iterator over a :class:`TextStream`'s chunks."""

    def __init__(self, next_item: _NextItem) -> None:
        self._next_item = next_item

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> SentenceChunk:
        while True:
            item = await self._next_item()
            if item is None:
                raise StopAsyncIteration
            if isinstance(item, SentenceChunk):
                return item


class TextFeed:
    """Text pushed in from elsewhere (a socket's events), read by one ``stream_text``.

    ``await feed.send(text)``, ``await feed.flush()``, ``feed.close()`` (the end of the
    text: what is left is spoken, then the stream ends).  At most ``max_pending``
    fragments wait unread (``send`` waits for room beyond that).
    """

    def __init__(self, max_pending: int = 256) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self._send: MemoryObjectSendStream[Fragment]
        self._receive: MemoryObjectReceiveStream[Fragment]
        self._send, self._receive = anyio.create_memory_object_stream(max_pending)

    async def send(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        await self._send.send(text)

    async def flush(self) -> None:
        await self._send.send(FLUSH)

    def close(self) -> None:
        """The end of the text: the stream speaks what is left, then ends."""
        self._send.close()

    def stop(self) -> None:
        """The reader is gone: what is unread is dropped, and ``send`` raises ``ClosedResourceError``."""
        self._receive.close()
        self._send.close()

    def __aiter__(self) -> TextFeed:
        return self

    async def __anext__(self) -> Fragment:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            self._receive.close()
            raise StopAsyncIteration from None


def client_session(opener: Opener) -> Callable[[], AbstractAsyncContextManager[SentenceOpener]]:
    """A session that always opens its sentences with ``opener``."""

    @asynccontextmanager
    async def session() -> AsyncIterator[SentenceOpener]:
        yield SentenceOpener(opener)

    return session


_Client = TypeVar("_Client", covariant=True)
_C = TypeVar("_C")


class Lease(Protocol[_Client]):
    """A member held for a stream (:class:`~indextts_client._pool._pool.PoolLease`)."""

    @property
    def client(self) -> _Client: ...

    @property
    def index(self) -> int: ...


class Leases(Protocol[_Client]):
    """What lends a stream its member: :meth:`Pool.lease` (``_pool`` imports this module)."""

    def lease(self, voice: Union[str, None]) -> AbstractAsyncContextManager[Lease[_Client]]: ...


def pool_session(
    pool: Leases[_C], voice: Union[str, None], open_on: Callable[[_C], Opener]
) -> Callable[[], AbstractAsyncContextManager[SentenceOpener]]:
    """One member of ``pool`` for the whole stream (the one routing picks for ``voice``, whose
    conditioning is warm), counted as one request in flight there until the end."""

    @asynccontextmanager
    async def session() -> AsyncIterator[SentenceOpener]:
        async with pool.lease(voice) as lease:
            yield SentenceOpener(open_on(lease.client), lease.index)

    return session

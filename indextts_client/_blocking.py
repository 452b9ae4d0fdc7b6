"""``BlockingClient``: the :class:`Client` API without async, for scripts and notebooks.

::

    from indextts_client import BlockingClient

    with BlockingClient("espeak") as client:
        audio = client.synthesize("Hello from a script.")
        audio.to_file("hello.flac")
        with client.stream("A longer text. In sentences.") as chunks:
            for chunk in chunks:
                play(chunk.samples)

An event loop runs in a daemon thread (:class:`~._loop_thread.LoopThread`); each method hands
its call to that loop and blocks until it returns.  Calls may come from
any number of threads at once: they run concurrently on the loop, as tasks sharing one
:class:`Client` do.  Progress callbacks run on the loop's thread.

Ctrl-C (or any exception raised in the waiting thread, such as a signal handler's) while a
method waits cancels that call on the loop, which cancels the request on the sidecar, and
re-raises at once: the sidecar is free for the next call.  Wherever the interrupt lands, the
waiting thread holds no lock the loop needs (see :mod:`._loop_thread`).  A client dropped without
:meth:`~BlockingClient.close` emits :class:`ResourceWarning` and is closed then (or at
interpreter exit).
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Final, Union

import anyio

from ._audio import Audio, AudioChunk, WordTiming
from ._client import Client
from ._exceptions import ClosedError
from ._loop_thread import LoopCall, LoopThread
from ._signature import REQUESTER, same_parameters
from ._stream_text import (
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_SENTENCE_CHARS,
    Fragment,
    SentenceChunk,
    SentenceEnd,
    TextStream,
)
from ._types import Health, LoadInfo, ProgressCallback, SidecarInfo
from ._wire._request import EmotionLike, Synthesis, TextFormat, TimeoutArg

__all__ = ["BlockingClient", "BlockingStream", "BlockingTextStream", "thread_fragments"]

#: How long closing a client that was dropped without close() may take.
_FINALIZE_GRACE = 30.0


def _refuse_inside_trio(backend: str) -> None:
    """A trio loop thread cannot be waited on from a thread that runs trio: say so instead of hanging."""
    if backend != "trio" or "trio" not in sys.modules:
        return
    import trio

    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return
    raise RuntimeError(
        "BlockingClient(backend='trio') cannot be used from inside a trio task: it would block "
        "the event loop it runs in; use the async Client there"
    )


def _finalize(loop: LoopThread, client: Client) -> None:
    """Close a BlockingClient that was dropped (or still open at exit) without close()."""
    warnings.warn(
        "BlockingClient was never closed: call close() or use 'with BlockingClient(...)'; closing it now",
        ResourceWarning,
        stacklevel=2,
    )
    closing = LoopCall(client.aclose)
    try:
        loop.submit(closing)
    except RuntimeError:  # the loop already ended
        return
    if threading.get_ident() == loop.thread.ident:
        return  # dropped on its own loop (in a callback): waiting would wait for itself
    try:
        closing.wait(_FINALIZE_GRACE)
    except Exception:  # a finalizer must not raise; the loop is stopped below
        pass
    loop.stop(_FINALIZE_GRACE)


class BlockingClient:
    """A :class:`Client` driven from synchronous code.

    Takes exactly :class:`Client`'s arguments, plus ``backend`` (``"asyncio"``, the
    default, or ``"trio"``) for the loop it runs in its own thread.  Use it as a context
    manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        engine: Union[str, None] = None,
        *,
        backend: str = "asyncio",
        backend_options: Union[dict[str, Any], None] = None,
        **client_options: Any,
    ) -> None:
        self._make = functools.partial(Client, engine, **client_options)
        self._backend = backend
        self._backend_options = backend_options
        self._loop: Union[LoopThread, None] = None
        self._client: Union[Client, None] = None
        self._closed = False
        self._finalizer: Union[weakref.finalize[Any, Any], None] = None

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the loop thread, spawn the sidecar and wait for ``ready`` (as :meth:`Client.start`)."""
        if self._closed:
            raise ClosedError("the client is closed")
        if self._loop is not None:
            raise RuntimeError("start() on a client that is already started")
        _refuse_inside_trio(self._backend)
        # A daemon thread: a script that forgets close() still exits (the finalizer below
        # stops the sidecar first).  The thread holds no reference to self: a dropped client
        # can be finalized.
        loop = self._loop = LoopThread(self._backend, self._backend_options, name="indextts_client BlockingClient")
        try:
            loop.start()  # (a Ctrl-C while it starts stops it below)
            client: Client = loop.run(self._make)  # built on the loop: its events belong to it
            self._client = client
            loop.run(client.start)
        except BaseException:
            self._stop_loop()
            raise
        self._finalizer = weakref.finalize(self, _finalize, loop, client)

    def close(self) -> None:
        """Stop the sidecar (as :meth:`Client.aclose`) and the loop thread.  Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._loop is None:
            return
        _refuse_inside_trio(self._backend)
        try:
            if self._client is not None:
                self._loop.run(self._client.aclose)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()

    def __enter__(self) -> BlockingClient:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        self.close()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        loop, client = self._started()
        _refuse_inside_trio(self._backend)
        return loop.run(functools.partial(getattr(client, method), *args, **kwargs))

    def _started(self) -> tuple[LoopThread, Client]:
        loop, client = self._loop, self._client
        if loop is None or client is None:
            if self._closed:
                raise ClosedError("the client is closed")
            raise RuntimeError("the client is not started: use 'with BlockingClient(...)' or client.start()")
        return loop, client

    # ---------------------------------------------------------------- requests

    @same_parameters(REQUESTER.synthesize)
    def synthesize(self, text: str, **kwargs: Any) -> Audio:
        """Speak ``text`` and return the whole :class:`Audio` (see :meth:`Client.synthesize`)."""
        audio: Audio = self._call("synthesize", text, **kwargs)
        return audio

    @same_parameters(REQUESTER.stream)
    def stream(self, text: str, **kwargs: Any) -> BlockingStream:
        """``with client.stream(text) as chunks: for chunk in chunks: ...`` (see :meth:`Client.stream`).

        Leaving the ``with`` block early cancels the request on the sidecar.
        """
        synthesis: Synthesis = self._call("stream", text, **kwargs)
        assert self._loop is not None
        return BlockingStream(self._loop, synthesis)

    def ping(self, *, timeout: TimeoutArg = ...) -> Health:
        health: Health = self._call("ping", timeout=timeout)
        return health

    def load(
        self,
        *,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
    ) -> LoadInfo:
        info: LoadInfo = self._call("load", on_progress=on_progress, timeout=timeout, idle_timeout=idle_timeout)
        return info

    def unload(self, *, timeout: TimeoutArg = ...) -> None:
        self._call("unload", timeout=timeout)

    def voices(self, *, timeout: TimeoutArg = ...) -> list[dict[str, Any]]:
        voices: list[dict[str, Any]] = self._call("voices", timeout=timeout)
        return voices

    def restart(self) -> None:
        self._call("restart")

    def is_alive(self) -> bool:
        return self._loop is not None and self._client is not None and bool(self._call("is_alive"))

    # -------------------------------------------------------------- properties

    def _client_or_fail(self) -> Client:
        if self._client is None:
            raise RuntimeError("the sidecar has not started yet")
        return self._client

    @property
    def info(self) -> SidecarInfo:
        return self._client_or_fail().info

    @property
    def pid(self) -> Union[int, None]:
        return None if self._client is None else self._client.pid

    @property
    def restarts(self) -> int:
        return 0 if self._client is None else self._client.restarts

    @property
    def dead(self) -> bool:
        return self._client is not None and self._client.dead

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stderr_tail(self) -> str:
        return "" if self._client is None else self._client.stderr_tail

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._loop is not None else "new"
        return f"<BlockingClient {state} pid={self.pid}>"

    def stream_text(
        self,
        texts: Iterable[Fragment],
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        text_format: TextFormat = "text",
        options: Union[Mapping[str, object], None] = None,
        **keywords: Any,
    ) -> BlockingTextStream:
        """``for chunk in client.stream_text(fragments): ...`` (see :meth:`Client.stream_text`).

        ``fragments`` is a plain iterable, read in a worker thread (it may block, e.g. on an
        LLM's stream).  Use ``with`` for the sentences to be cancelled the moment the loop is left.
        """
        loop, client = self._started()
        stream = loop.run(
            functools.partial(
                client.stream_text,
                thread_fragments(texts),
                voice=voice,
                emotion=emotion,
                sample_rate=sample_rate,
                timeout=timeout,
                idle_timeout=idle_timeout,
                lookahead=lookahead,
                max_sentence_chars=max_sentence_chars,
                text_format=text_format,
                options=options,
                **keywords,
            )
        )
        return BlockingTextStream(loop, stream)


class BlockingStream:
    """A streamed request, iterated synchronously inside ``with``; leaving early cancels it."""

    def __init__(self, loop: LoopThread, synthesis: Synthesis) -> None:
        self._loop = loop
        self._synthesis = synthesis
        self._entered = False

    def __enter__(self) -> BlockingStream:
        try:
            self._loop.run(self._synthesis.__aenter__)
            self._entered = True
            return self
        except BaseException:
            # 'with' calls no __exit__ when __enter__ raises; a Ctrl-C that came once the
            # request was sent would leave it running on the sidecar: close it here.
            try:
                self._loop.run(self._synthesis.aclose)
            except Exception:  # the interrupt (or the error that ended the request) is what the caller sees
                pass
            raise

    def __exit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        self._loop.run(functools.partial(self._synthesis.__aexit__, exc_type, exc, tb))

    def __iter__(self) -> Iterator[AudioChunk]:
        if not self._entered:
            raise RuntimeError("iterate inside 'with client.stream(...) as chunks:', so that leaving early cancels it")
        while True:
            try:
                chunk: AudioChunk = self._loop.run(self._synthesis.__anext__)
            except StopAsyncIteration:
                return
            yield chunk

    @property
    def finished(self) -> bool:
        return self._synthesis.finished

    @property
    def timings(self) -> dict[str, float]:
        return self._synthesis.timings

    @property
    def words(self) -> tuple[WordTiming, ...]:
        """Every word of the request (as :attr:`Audio.words`), once it finished."""
        return self._synthesis.words

    @property
    def request_id(self) -> Union[int, None]:
        return self._synthesis.request_id


class thread_fragments:
    """Fragments of a plain iterable read in a worker thread (it may block: a blocking LLM client)."""

    _END: Final = object()

    def __init__(self, texts: Iterable[Fragment]) -> None:
        self._iterator = iter(texts)

    def _step(self) -> Any:
        return next(self._iterator, self._END)

    def __aiter__(self) -> thread_fragments:
        return self

    async def __anext__(self) -> Fragment:
        piece = await anyio.to_thread.run_sync(self._step, abandon_on_cancel=True)
        if piece is self._END:
            raise StopAsyncIteration
        result: Fragment = piece
        return result


class BlockingTextStream:
    """``stream_text`` for synchronous code: a plain iterator of :class:`SentenceChunk`.

    ``for chunk in client.stream_text(fragments): ...`` or, to be sure the sentences are
    cancelled the moment the loop is left (not when the iterator is collected),
    ``with client.stream_text(fragments) as chunks: for chunk in chunks: ...``.
    """

    def __init__(self, loop: LoopThread, stream: TextStream) -> None:
        self._loop = loop
        self._stream = stream
        #: Leaves the stream's context, which a task of the loop holds open.
        self._leave: Union[Callable[[], None], None] = None
        self._iterating = False

    def __enter__(self) -> BlockingTextStream:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        self.close()

    def _open(self) -> None:
        if self._leave is None:
            # The stream's task group lives in one task of the loop for the stream's lifetime.
            self._leave = self._loop.hold(self._stream)

    def close(self) -> None:
        """Cancel what is still queued or being synthesized (idempotent)."""
        leave, self._leave = self._leave, None
        if leave is not None:
            leave()

    def __iter__(self) -> Iterator[SentenceChunk]:
        return self._iterate(chunks_only=True)  # type: ignore[return-value]

    def events(self) -> Iterator[Union[SentenceChunk, SentenceEnd]]:
        """The chunks, with a :class:`SentenceEnd` after each sentence's last one."""
        return self._iterate(chunks_only=False)

    def _iterate(self, *, chunks_only: bool) -> Iterator[Union[SentenceChunk, SentenceEnd]]:
        if self._iterating:
            raise RuntimeError("a stream_text() is iterated once")
        self._iterating = True
        owns = self._leave is None
        self._open()
        try:
            while True:
                item = self._loop.run(self._stream.next_event)
                if item is None:
                    return
                if chunks_only and not isinstance(item, SentenceChunk):
                    continue
                yield item
        finally:
            if owns:
                self.close()

    @property
    def sentences(self) -> int:
        return self._stream.sentences

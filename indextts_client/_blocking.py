"""``BlockingClient``: the :class:`Client` API without async, for scripts and notebooks.

::

    from indextts_client import BlockingClient

    with BlockingClient("espeak") as client:
        audio = client.synthesize("Hello from a script.")
        audio.to_file("hello.flac")
        with client.stream("A longer text. In sentences.") as chunks:
            for chunk in chunks:
                play(chunk.samples)

An event loop runs in a daemon thread behind an anyio :class:`~anyio.from_thread.BlockingPortal`;
each method hands its call to that loop and blocks until it returns.  Calls may come from
any number of threads at once: they run concurrently on the loop, as tasks sharing one
:class:`Client` do.  Progress callbacks run on the loop's thread.

Ctrl-C (or any exception raised in the waiting thread, such as a signal handler's) while a
method waits cancels that call on the loop, which cancels the request on the sidecar, and
re-raises at once: the sidecar is free for the next call.  A client dropped without
:meth:`~BlockingClient.close` emits :class:`ResourceWarning` and is closed then (or at
interpreter exit).
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import queue
import sys
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Final, Union

import anyio
from anyio.from_thread import BlockingPortal

from ._audio import Audio, AudioChunk, WordTiming
from ._client import Client
from ._exceptions import ClosedError
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

#: How long an interrupted call waits for the loop to finish cancelling it (the cancel frame
#: to be written, a starting sidecar to be stopped) before re-raising anyway.
_CANCEL_GRACE = 5.0
#: How long closing a client that was dropped without close() may take.
_FINALIZE_GRACE = 30.0
#: Seconds between the waiting thread's checks for a signal (Ctrl-C) while a call runs.
_SIGNAL_POLL = 0.1


def _refuse_inside_trio(backend: str) -> None:
    """A trio portal cannot be called from a thread that runs trio: say so instead of hanging."""
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


def _run(portal: BlockingPortal, fn: Callable[[], Union[Awaitable[Any], Any]]) -> Any:
    """Run ``fn`` on the portal's loop and wait; if the wait is interrupted, cancel it there."""
    finished = threading.Event()

    async def call() -> Any:
        try:
            result = fn()
            return await result if inspect.isawaitable(result) else result
        finally:
            finished.set()

    future = portal.start_task_soon(call)
    try:
        return _result(future)
    except BaseException:
        # KeyboardInterrupt (Ctrl-C) or another exception raised in this thread while it
        # waited: the call must not run on unseen.  Cancelling it on the loop cancels the
        # request on the sidecar; wait (bounded) until that is done, then re-raise.
        if not future.done():
            future.cancel()
            finished.wait(_CANCEL_GRACE)
        raise


def _result(future: concurrent.futures.Future[Any]) -> Any:
    """``future.result()``, waking every :data:`_SIGNAL_POLL` seconds so that Ctrl-C is seen.

    The kernel may deliver SIGINT to any thread, the loop's among them; Python then runs its
    handler only once the main thread executes bytecode again, which a plain blocking wait
    does not until the call ends (a start() would sit out its whole ready timeout).
    """
    while True:
        try:
            return future.result(_SIGNAL_POLL)
        except concurrent.futures.TimeoutError:
            continue


def _finalize(portal: BlockingPortal, client: Client, thread: threading.Thread) -> None:
    """Close a BlockingClient that was dropped (or still open at exit) without close()."""
    warnings.warn(
        "BlockingClient was never closed: call close() or use 'with BlockingClient(...)'; closing it now",
        ResourceWarning,
        stacklevel=2,
    )
    if threading.get_ident() == thread.ident:
        # Dropped on its own loop (in a callback): stopping would wait for itself.
        portal.start_task_soon(client.aclose)
        return
    try:
        portal.start_task_soon(client.aclose).result(_FINALIZE_GRACE)
    except Exception:  # a finalizer must not raise; the loop is stopped below
        pass
    try:
        portal.call(portal.stop, True)
    except RuntimeError:  # the loop already ended
        pass
    thread.join(_FINALIZE_GRACE)


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
        self._portal: Union[BlockingPortal, None] = None
        self._thread: Union[threading.Thread, None] = None
        self._client: Union[Client, None] = None
        self._closed = False
        self._finalizer: Union[weakref.finalize[Any, Any], None] = None

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the loop thread, spawn the sidecar and wait for ``ready`` (as :meth:`Client.start`)."""
        if self._closed:
            raise ClosedError("the client is closed")
        if self._portal is not None:
            raise RuntimeError("start() on a client that is already started")
        _refuse_inside_trio(self._backend)
        handoff: queue.Queue[Union[BlockingPortal, BaseException]] = queue.Queue()
        # The thread holds no reference to self: a dropped client can be finalized.
        backend, backend_options = self._backend, self._backend_options

        async def serve() -> None:
            async with BlockingPortal() as portal:
                handoff.put(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(serve, backend=backend, backend_options=backend_options)
            except BaseException as exc:  # e.g. trio not installed: reported to start()
                handoff.put(exc)

        # A daemon thread: a script that forgets close() still exits (the finalizer below
        # stops the sidecar first).
        thread = threading.Thread(target=run, name="indextts_client BlockingClient", daemon=True)
        thread.start()
        got = handoff.get()
        if isinstance(got, BaseException):
            thread.join()
            raise got
        self._portal, self._thread = got, thread
        try:
            client: Client = got.call(self._make)  # built on the loop: its events belong to it
            self._client = client
            _run(got, client.start)
        except BaseException:
            self._stop_loop(cancel=True)
            raise
        self._finalizer = weakref.finalize(self, _finalize, got, client, thread)

    def close(self) -> None:
        """Stop the sidecar (as :meth:`Client.aclose`) and the loop thread.  Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._portal is None:
            return
        _refuse_inside_trio(self._backend)
        try:
            if self._client is not None:
                _run(self._portal, self._client.aclose)
        finally:
            self._stop_loop(cancel=True)

    def _stop_loop(self, *, cancel: bool = False) -> None:
        portal, thread = self._portal, self._thread
        self._portal = self._thread = None
        if portal is not None:
            try:
                portal.call(portal.stop, cancel)
            except RuntimeError:  # the loop already ended
                pass
        if thread is not None:
            thread.join()

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
        portal, client = self._portal, self._client
        if portal is None or client is None:
            if self._closed:
                raise ClosedError("the client is closed")
            raise RuntimeError("the client is not started: use 'with BlockingClient(...)' or client.start()")
        _refuse_inside_trio(self._backend)
        return _run(portal, functools.partial(getattr(client, method), *args, **kwargs))

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
        assert self._portal is not None
        return BlockingStream(self._portal, synthesis)

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
        return self._portal is not None and self._client is not None and bool(self._call("is_alive"))

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
        state = "closed" if self._closed else "running" if self._portal is not None else "new"
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
        portal, client = self._portal, self._client
        if portal is None or client is None:
            if self._closed:
                raise ClosedError("the client is closed")
            raise RuntimeError("the client is not started: use 'with BlockingClient(...)' or client.start()")
        stream = portal.call(
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
        return BlockingTextStream(portal, stream)


class BlockingStream:
    """A streamed request, iterated synchronously inside ``with``; leaving early cancels it."""

    def __init__(self, portal: BlockingPortal, synthesis: Synthesis) -> None:
        self._portal = portal
        self._synthesis = synthesis
        self._entered = False

    def __enter__(self) -> BlockingStream:
        _run(self._portal, self._synthesis.__aenter__)
        self._entered = True
        return self

    def __exit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        _run(self._portal, functools.partial(self._synthesis.__aexit__, exc_type, exc, tb))

    def __iter__(self) -> Iterator[AudioChunk]:
        if not self._entered:
            raise RuntimeError("iterate inside 'with client.stream(...) as chunks:', so that leaving early cancels it")
        while True:
            try:
                chunk: AudioChunk = _run(self._portal, self._synthesis.__anext__)
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

    def __init__(self, portal: BlockingPortal, stream: TextStream) -> None:
        self._portal = portal
        self._stream = stream
        self._context: Union[AbstractContextManager[TextStream], None] = None
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
        if self._context is None:
            # The stream's task group lives in one task of the loop for the stream's lifetime.
            context = self._portal.wrap_async_context_manager(self._stream)
            context.__enter__()
            self._context = context

    def close(self) -> None:
        """Cancel what is still queued or being synthesized (idempotent)."""
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(None, None, None)

    def __iter__(self) -> Iterator[SentenceChunk]:
        return self._iterate(chunks_only=True)  # type: ignore[return-value]

    def events(self) -> Iterator[Union[SentenceChunk, SentenceEnd]]:
        """The chunks, with a :class:`SentenceEnd` after each sentence's last one."""
        return self._iterate(chunks_only=False)

    def _iterate(self, *, chunks_only: bool) -> Iterator[Union[SentenceChunk, SentenceEnd]]:
        if self._iterating:
            raise RuntimeError("a stream_text() is iterated once")
        self._iterating = True
        owns = self._context is None
        self._open()
        try:
            while True:
                item = self._portal.call(self._stream.next_event)
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

"""The sidecar server: reader, dispatcher, one engine worker, one writer.

The event loop never runs engine code.  The reader decodes frames and answers
``ping`` and ``cancel`` at once; ``synthesize``, ``load`` and ``unload`` go through a
bounded FIFO to the worker, which runs them one at a time on a dedicated engine thread.
Every frame leaves through one writer task, so frames never interleave on the pipe;
audio frames hold one of a few slots until written, which bounds the memory audio can
take when the parent reads slowly, while control frames never wait for a slot.

A :class:`Server` serves one connection.  Its FIFO is one of the queues of a
:class:`Scheduler`, which owns the engine thread: over stdio there is one connection
and one queue; a sidecar listening on a socket gives every connection its own
:class:`Server` (its own ids, its own queue) over one shared scheduler, which takes
the next job from each non-empty queue in turn, so no connection starves another.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import queue
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, Union

import anyio
import msgspec
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.lowlevel import current_token

from . import protocol
from ._paths import PathPolicy
from ._voices import VoiceStore
from .engines import Cancelled, Engine, EngineError, RequestError, SynthesisRequest
from .protocol import (
    REGISTERED_PREFIX,
    Cancel,
    Done,
    EmotionAudio,
    Error,
    Load,
    Ok,
    Ping,
    Pong,
    Progress,
    RegisterVoice,
    Shutdown,
    Synthesize,
    Unload,
)
from .protocol.framing import FrameReader, FrameWriter, FramingError
from .protocol.shm import AudioRing

__all__ = ["EngineThread", "Scheduler", "Server"]

log = logging.getLogger("indextts_sidecar")
T = TypeVar("T")

#: Exit codes, documented in docs/protocol.md.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FRAMING = 3

#: Longest ``text`` of a request, in characters (``--max-text``): about 1.5 hours of speech.
DEFAULT_MAX_TEXT = 100_000
#: Frames queued for the parent past which the reader stops reading requests (``--max-outgoing``).
DEFAULT_MAX_OUTGOING = 1024

_AUDIO_SLOTS = 4
_AUDIO_FRAME_BYTES = 4 * 1024 * 1024
#: Chunks smaller than this travel in the frame: the pipe moves them as fast, and the ring
#: pages the parent touches would count in its resident memory.
_SHARED_MIN = 256 * 1024
_EMPTY = memoryview(b"")


class EngineThread:
    """One long-lived thread that runs every engine call, one at a time.

    Engines wrap libraries that are not thread-safe and that keep per-thread state
    (CUDA streams, caches); a thread pool would move them between threads.
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Union[Callable[[], None], None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="indextts-engine", daemon=True)

    def _main(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    def close(self) -> None:
        """Let the thread end after its current call."""
        self._calls.put(None)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread and return its result.

        If the caller is cancelled, ``fn`` keeps running: engines stop cooperatively,
        through the cancellation check they are given.
        """
        if not self._thread.is_alive():
            self._thread.start()
        post = LoopPoster()
        done = anyio.Event()
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append((True, fn()))
            except BaseException as exc:  # delivered to the awaiting task
                outcome.append((False, exc))
            post(done.set)

        self._calls.put(call)
        await done.wait()
        ok, value = outcome[0]
        if ok:
            return value  # type: ignore[no-any-return]
        raise value


#: Parts of one frame to write back to back, and whether the frame holds an audio slot.
_Outgoing = tuple[tuple[Union[bytes, memoryview], ...], bool]


class LoopPoster:
    """Schedules a callback on the current event loop from any thread, without waiting.

    ``anyio.from_thread.run_sync`` waits for the loop to run the callback, a round trip
    per progress or audio frame; the engine thread only needs its frames queued in order,
    so it hands them over with the backend's own thread-safe ``call_soon``.
    """

    def __init__(self) -> None:
        native: Any = current_token().native_token
        # asyncio: the loop's call_soon_threadsafe; trio: TrioToken.run_sync_soon.
        self._post: Callable[[Callable[[], None]], object] = getattr(native, "call_soon_threadsafe", None) or (
            native.run_sync_soon
        )

    def __call__(self, fn: Callable[..., None], *args: Any) -> None:
        def guarded() -> None:
            try:
                fn(*args)
            except Exception:  # a callback must never take the event loop down
                log.exception("internal error in a callback from the engine thread")

        try:
            self._post(guarded)
        except Exception:  # the event loop has ended: nobody is listening
            pass


class Scheduler:
    """One engine thread, fed round robin from the queues of the connections attached to it."""

    def __init__(self, engine: Engine[Any, Any]) -> None:
        self.engine = engine
        self.engine_thread = EngineThread()
        self.started = time.monotonic()
        self.servers: list[Server] = []
        self._changed = anyio.Event()
        self._turn = 0

    def attach(self, server: Server) -> None:
        self.servers.append(server)

    def detach(self, server: Server) -> None:
        if server in self.servers:
            self.servers.remove(server)

    def notify(self) -> None:
        """A queue gained a job."""
        self._changed.set()

    async def _next(self) -> tuple[Server, _Job]:
        while True:
            count = len(self.servers)
            for step in range(count):
                index = (self._turn + step) % count
                server = self.servers[index]
                if server._queue:
                    # The next turn starts after this connection: round robin.
                    self._turn = index + 1
                    job_id = next(iter(server._queue))
                    return server, server._queue.pop(job_id)
            self._changed = anyio.Event()
            await self._changed.wait()

    async def run(self) -> None:
        """Run queued jobs one at a time, for ever (until cancelled)."""
        while True:
            server, job = await self._next()
            await server._run_job(job)

    def close(self) -> None:
        """Let the engine thread end after its current call."""
        self.engine_thread.close()


class _Job:
    __slots__ = ("cancel", "cancel_code", "enqueued", "finished", "id", "kind", "request", "started")

    def __init__(self, request_id: int, kind: str, request: Union[SynthesisRequest[Any], None] = None) -> None:
        self.id = request_id
        self.kind = kind
        self.request = request
        self.cancel = threading.Event()
        #: The error code the job ends with once ``cancel`` is set.
        self.cancel_code = "cancelled"
        self.enqueued = time.monotonic()
        self.started = 0.0
        self.finished = False


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class Server:
    """Serves one connection: any pair of anyio byte streams carrying protocol v1."""

    def __init__(
        self,
        engine: Engine[Any, Any],
        *,
        max_queue: int = 64,
        max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE,
        frame_timeout: Union[float, None] = 10.0,
        shutdown_grace: float = 0.5,
        shared_audio: Union[AudioRing, None] = None,
        max_text: int = DEFAULT_MAX_TEXT,
        max_outgoing: int = DEFAULT_MAX_OUTGOING,
        paths: Union[PathPolicy, None] = None,
        scheduler: Union[Scheduler, None] = None,
        voices: Union[VoiceStore, None] = None,
    ) -> None:
        self.engine = engine
        #: A server that makes its own scheduler runs and closes it; a shared one is its owner's.
        self._owns_scheduler = scheduler is None
        self.scheduler = scheduler if scheduler is not None else Scheduler(engine)
        self.voices = voices
        self.paths = paths if paths is not None else PathPolicy()
        self.max_text = max_text
        self.max_outgoing = max_outgoing
        self.shared_audio = shared_audio
        self.max_queue = max_queue
        self.max_frame_size = max_frame_size
        self.frame_timeout = frame_timeout
        self.shutdown_grace = shutdown_grace
        self.engine_thread = self.scheduler.engine_thread
        self._inflight: dict[int, _Job] = {}
        self._queue: dict[int, _Job] = {}
        self._active: Union[_Job, None] = None
        self._idle = anyio.Event()
        self._idle.set()
        self._out_send, self._out_receive = anyio.create_memory_object_stream[_Outgoing](math.inf)
        # Audio frames queued but not yet written; the engine thread waits for a slot.
        self._audio_slots = threading.Semaphore(_AUDIO_SLOTS)
        self._audio_frame_bytes = max(2, min(_AUDIO_FRAME_BYTES, (max_frame_size - 1024)) // 2 * 2)
        self._read_scope = anyio.CancelScope()
        self._shutdown_requested = False
        self._drained = anyio.Event()
        self._writer_done = anyio.Event()

    # ------------------------------------------------------------ output

    def _send(self, message: protocol.Reply) -> None:
        """Queue a control frame; never blocks, never waits behind audio."""
        try:
            self._out_send.send_nowait(((protocol.frame(message),), False))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def _finish(self, job: _Job, message: protocol.Reply) -> None:
        """Send ``job``'s terminal frame, unless it already has one."""
        if job.finished:
            return
        job.finished = True
        self._inflight.pop(job.id, None)
        self._send(message)

    def _queue_audio(self, job: _Job, parts: tuple[bytes, memoryview]) -> None:
        if job.finished:  # ended meanwhile (shutdown): nothing may follow its terminal frame
            self._audio_slots.release()
            return
        try:
            self._out_send.send_nowait((parts, True))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._audio_slots.release()

    def _send_shared(self, job: _Job, message: protocol.Audio) -> None:
        # A job is finished early only when the sidecar is stopping; its unsent region
        # would be released with the next one the parent releases.
        if not job.finished:
            self._send(message)

    async def _writer(self, writer: FrameWriter, stop: anyio.CancelScope) -> None:
        try:
            await self._write_all(writer)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            # (A TLS stream reports a peer that closed as EndOfStream, also on send.)
            log.info("parent closed the reply stream; stopping")
            stop.cancel()
        finally:
            self._writer_done.set()

    async def _write_all(self, writer: FrameWriter) -> None:
        async with self._out_receive:
            async for parts, is_audio in self._out_receive:
                # Frames queued meanwhile go out in the same writev, up to 1 MiB.
                batch, audio, size = list(parts), int(is_audio), sum(map(len, parts))
                while size < 1 << 20:
                    try:
                        parts, is_audio = self._out_receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    batch.extend(parts)
                    audio += is_audio
                    size += sum(map(len, parts))
                try:
                    await writer.send_parts(batch)
                finally:
                    for _ in range(audio):
                        self._audio_slots.release()
                if self._out_receive.statistics().current_buffer_used <= self.max_outgoing // 2:
                    self._drained.set()

    # ------------------------------------------------------------- serve

    def stop(self) -> None:
        """End serving as if the input had ended (used for SIGTERM); safe to call twice."""
        self._read_scope.cancel()

    async def serve(
        self, receive: ByteReceiveStream, send: ByteSendStream, ready: Union[protocol.Ready, None] = None
    ) -> int:
        """Serve until shutdown, end of input or framing loss; return the exit code."""
        writer = FrameWriter(send)
        reader = FrameReader(receive, max_frame_size=self.max_frame_size, frame_timeout=self.frame_timeout)
        code = EXIT_OK
        if ready is not None:
            self._send(ready)
        self.scheduler.attach(self)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._writer, writer, self._read_scope)
                if self._owns_scheduler:
                    tg.start_soon(self.scheduler.run)
                try:
                    with self._read_scope:
                        code = await self._read_loop(reader)
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop_jobs()
                        if code == EXIT_OK and not self._shutdown_requested:
                            # After every terminal frame: a request without one was never
                            # read, and the parent may send it to a new sidecar.
                            self._send(
                                Error(
                                    code="shutting_down",
                                    message="the sidecar is stopping; it read no request after those it ended",
                                )
                            )
                        self._out_send.close()
                        # The writer flushes what is queued, then ends.
                        with anyio.move_on_after(self.shutdown_grace):
                            await self._writer_done.wait()
                        tg.cancel_scope.cancel()
        finally:
            self.scheduler.detach(self)
            if self._owns_scheduler:
                self.scheduler.close()
            with anyio.CancelScope(shield=True):
                await writer.aclose()
                await receive.aclose()
        return code

    async def _stop_jobs(self) -> None:
        """End every request with a terminal frame; give the running one a grace period."""
        for job in list(self._queue.values()):
            self._queue.pop(job.id, None)
            self._finish(job, _shutting_down(job))
        active = self._active
        if active is not None:
            active.cancel_code = "shutting_down"
            active.cancel.set()
            with anyio.move_on_after(self.shutdown_grace):
                await self._idle.wait()
        for job in list(self._inflight.values()):
            self._finish(job, _shutting_down(job))

    async def _read_loop(self, reader: FrameReader) -> int:
        while True:
            while self._out_send.statistics().current_buffer_used >= self.max_outgoing:
                # The parent is not reading replies: stop reading requests (which make
                # more replies) until half the queue is written. The pipe then fills up,
                # and the parent's writes wait, instead of our memory growing.
                self._drained = anyio.Event()
                await self._drained.wait()
            try:
                body = await reader.receive()
            except FramingError as exc:
                log.error("framing lost: %s", exc)
                self._send(Error(code=exc.code, message=f"{exc}; closing the connection", detail={"fatal": True}))
                return EXIT_FRAMING
            if body is None:
                log.info("end of input: the parent closed the request stream")
                return EXIT_OK
            try:
                message = protocol.decode_request(body)
            except (msgspec.MsgspecError, RecursionError) as exc:
                # RecursionError: nested deeper than msgspec can follow. One bad message
                # costs that message only, never the connection.
                self._reject(protocol.describe_invalid(body, exc))
                continue
            if message.id in self._inflight:
                # Checked first, for every op: a ping, cancel or shutdown reusing a live
                # id would otherwise give that id a second terminal frame.
                self._send(
                    Error(
                        code="duplicate_id",
                        message=f"request id {message.id} is already in flight",
                        detail={"field": "$.id"},
                    )
                )
                continue
            if isinstance(message, Cancel) and message.target == message.id:
                self._send(
                    Error(
                        code="invalid_message",
                        id=message.id,
                        message=f"cancel {message.id} names itself as its target",
                        detail={"field": "$.target"},
                    )
                )
                continue
            if isinstance(message, Shutdown):
                self._shutdown_requested = True
                await self._stop_jobs()
                self._send(Ok(id=message.id, info={"exit_code": EXIT_OK}))
                return EXIT_OK
            try:
                self._dispatch(message)
            except Exception as exc:  # a bug (in the sidecar, or an engine's check()) costs this request only
                log.exception("internal error dispatching request %d", message.id)
                self._inflight.pop(message.id, None)
                self._queue.pop(message.id, None)
                self._send(Error(code="internal", id=message.id, message=f"{type(exc).__name__}: {exc}"))

    # ----------------------------------------------------------- dispatch

    def _reject(self, error: Error) -> None:
        """Answer a message that could not be decoded."""
        if error.id is not None and error.id in self._inflight:
            error.id = None  # never a second terminal frame for a live id
        self._send(error)

    def _dispatch(self, message: protocol.Request) -> None:
        if isinstance(message, Ping):
            self._send(self._pong(message.id))
            return
        if isinstance(message, Cancel):
            found = self._cancel(message.target)
            self._send(Ok(id=message.id, info={"found": found}))
            return
        if isinstance(message, protocol.Voices):
            self._send(_voices_reply(self.engine, message.id))
            return
        if isinstance(message, RegisterVoice):
            if self.voices is None:
                self._send(
                    Error(
                        code="invalid_input",
                        id=message.id,
                        message="this sidecar stores no voices: start it with --voice-dir",
                        detail={"field": "$.audio"},
                    )
                )
                return
            try:
                info = self.voices.register(message.name, message.audio)
            except EngineError as exc:
                self._send(_error_for(message.id, exc))
                return
            log.info("voice %r registered (%d bytes, sha256 %s)", message.name, info["bytes"], info["sha256"])
            self._send(Ok(id=message.id, info=info))
            return
        job: _Job
        if isinstance(message, Synthesize):
            try:
                job = _Job(message.id, "synthesize", self._synthesis_request(message))
            except EngineError as exc:
                self._send(_error_for(message.id, exc))
                return
        elif isinstance(message, (Load, Unload)):
            job = _Job(message.id, message.__struct_config__.tag)  # type: ignore[arg-type]
        else:  # pragma: no cover - the union is exhausted above
            raise AssertionError(message)
        if len(self._queue) >= self.max_queue:
            self._send(
                Error(
                    code="busy",
                    id=message.id,
                    retryable=True,
                    message=f"the request queue is full ({self.max_queue} waiting); retry later",
                    detail={"queue_depth": len(self._queue)},
                )
            )
            return
        self._inflight[job.id] = job
        self._queue[job.id] = job
        self.scheduler.notify()

    def _synthesis_request(self, message: Synthesize) -> SynthesisRequest[Any]:
        engine = self.engine
        try:
            options = msgspec.convert(message.options, engine.RequestOptions)
        except msgspec.ValidationError as exc:
            text = str(exc)
            code = "unknown_option" if "unknown field" in text else "invalid_option"
            raise EngineError(f"options: {text}", code=code, field=protocol.field_of(exc, "$.options")) from None
        if len(message.text) > self.max_text:
            raise EngineError(
                f"text of {len(message.text)} characters is longer than the limit of {self.max_text} (--max-text)",
                code="invalid_input",
                field="$.text",
            )
        if message.sample_rate is not None and not 1000 <= message.sample_rate <= 384000:
            raise EngineError(
                f"sample_rate {message.sample_rate} is outside 1000..384000 Hz",
                code="invalid_option",
                field="$.sample_rate",
            )
        voice = message.voice
        if voice is not None and voice.startswith(REGISTERED_PREFIX):
            voice = self._registered(voice, "$.voice")
        if isinstance(message.emotion, EmotionAudio) and message.emotion.path.startswith(REGISTERED_PREFIX):
            path = self._registered(message.emotion.path, "$.emotion.path")
            message.emotion = EmotionAudio(path=path, alpha=message.emotion.alpha)
        if engine.reads_paths:
            if voice is not None:
                self.paths.check(voice, "$.voice", "voice reference")
            if isinstance(message.emotion, EmotionAudio):
                self.paths.check(message.emotion.path, "$.emotion.path", "emotion reference")
        request = SynthesisRequest(
            id=message.id,
            text=message.text,
            voice=voice,
            emotion=message.emotion,
            options=options,
            sample_rate=message.sample_rate,
        )
        engine.check(request)
        return request

    def _registered(self, value: str, field: str) -> str:
        if self.voices is None:
            raise RequestError(f"{value!r} names a registered voice, but this sidecar has no --voice-dir", field=field)
        return self.voices.resolve(value, field)

    def _cancel(self, target: int) -> bool:
        job = self._queue.pop(target, None)
        if job is not None:
            self._finish(job, Error(code="cancelled", id=target, message="cancelled while queued"))
            return True
        active = self._active
        if active is not None and active.id == target and not active.finished:
            active.cancel.set()
            return True
        return False

    def _pong(self, request_id: int) -> Pong:
        memory = {"rss": _rss()}
        try:
            memory.update(self.engine.memory())
        except Exception as exc:  # a broken memory report must not break health checks
            log.warning("engine memory report failed: %s", exc)
        active = self._active
        return Pong(
            id=request_id,
            loaded=self.engine.loaded,
            queue_depth=len(self._queue),
            active=None if active is None else active.id,
            memory=memory,
            uptime=round(time.monotonic() - self.scheduler.started, 3),
            dropped_options=list(self.engine.dropped_options),
        )

    # ------------------------------------------------------------- worker

    async def _run_job(self, job: _Job) -> None:
        """Run one of this connection's jobs on the engine thread (called by the scheduler)."""
        self._active = job
        self._idle = anyio.Event()
        job.started = time.monotonic()
        post = LoopPoster()
        try:
            terminal = await self.engine_thread.run(functools.partial(self._execute, job, post))
        except Exception as exc:  # a bug here must still end the request
            log.exception("internal error running request %d", job.id)
            terminal = Error(code="internal", id=job.id, message=f"{type(exc).__name__}: {exc}")
        finally:
            self._active = None
            self._idle.set()
        self._finish(job, terminal)

    def _progress_fn(self, job: _Job, post: LoopPoster) -> Callable[..., None]:
        def progress(stage: str, fraction: Union[float, None] = None, message: str = "") -> None:
            if fraction is not None:
                fraction = min(1.0, max(0.0, float(fraction)))
            post(self._broadcast_progress, job, stage, fraction, message)

        return progress

    def _broadcast_progress(self, job: _Job, stage: str, fraction: Union[float, None], message: str) -> None:
        if job.finished:
            return
        self._send(Progress(id=job.id, stage=stage, fraction=fraction, message=message))
        if stage == "load":
            # Every request queued behind this one, on any connection, waits on the same load.
            for server in self.scheduler.servers:
                for waiting in server._queue.values():
                    if waiting.kind == "synthesize":
                        server._send(Progress(id=waiting.id, stage=stage, fraction=fraction, message=message))

    def _execute(self, job: _Job, post: LoopPoster) -> protocol.Reply:
        """Runs on the engine thread; returns the job's terminal message."""
        engine = self.engine
        progress = self._progress_fn(job, post)
        cancelled = job.cancel.is_set
        timings: dict[str, float] = {"queued": job.started - job.enqueued}
        try:
            if job.kind == "unload":
                engine.unload()
                return Ok(id=job.id, info={"loaded": engine.loaded})
            if not engine.loaded:
                began = time.monotonic()
                try:
                    engine.load(progress, cancelled)
                except (Cancelled, EngineError):
                    raise
                except Exception as exc:
                    log.error("engine load failed: %s", exc, exc_info=True)
                    raise _LoadFailed(exc) from exc
                timings["load"] = time.monotonic() - began
            if job.kind == "load":
                info = {**engine.info(), "loaded": True, "sample_rate": engine.sample_rate, **timings}
                return Ok(id=job.id, info=info)
            assert job.request is not None
            return self._run_synthesis(job, job.request, progress, post, timings)
        except Cancelled:
            return _cancelled(job)
        except EngineError as exc:
            return _error_for(job.id, exc)
        except _LoadFailed as exc:
            cause = exc.__cause__
            return Error(
                code="load_failed",
                id=job.id,
                retryable=True,
                message=f"the model failed to load: {type(cause).__name__}: {cause}",
                detail={"traceback": "".join(traceback.format_exception(cause)) if cause else ""},
            )
        except Exception as exc:
            log.error("engine failed on request %d", job.id, exc_info=True)
            return Error(
                code="engine_error",
                id=job.id,
                message=f"{type(exc).__name__}: {exc}",
                detail={"traceback": traceback.format_exc()},
            )

    def _run_synthesis(
        self,
        job: _Job,
        request: SynthesisRequest[Any],
        progress: Callable[..., None],
        post: LoopPoster,
        timings: dict[str, float],
    ) -> protocol.Reply:
        engine = self.engine
        native = engine.sample_rate
        if native is None:
            raise EngineError("the engine reported no sample rate after loading", code="internal")
        rate = request.sample_rate or native
        ring = self.shared_audio
        began = time.monotonic()
        samples = 0
        seq = 0
        chunks: Iterator[Any] = iter(engine.synthesize(request, progress, job.cancel.is_set))
        if rate != native:
            from ._resample import resampled  # numpy, only when asked for

            chunks = resampled(chunks, native, rate)
        try:
            for chunk in chunks:
                if job.cancel.is_set():
                    return _cancelled(job)
                view = memoryview(chunk).cast("B")
                if len(view) % 2:
                    raise EngineError(
                        f"engine yielded a chunk of {len(view)} bytes: not whole int16 samples", code="internal"
                    )
                if seq == 0 and len(view):
                    timings["first_audio"] = time.monotonic() - job.enqueued
                step = self._audio_frame_bytes
                for start in range(0, len(view), step):
                    piece = view[start : start + step]
                    position = ring.write(piece) if ring is not None and len(piece) >= _SHARED_MIN else None
                    if position is not None:
                        # In shared memory: the frame only names the region.
                        shared = protocol.Audio(
                            id=job.id, seq=seq, sample_rate=rate, shm_offset=position, shm_size=len(piece), pcm=_EMPTY
                        )
                        post(self._send_shared, job, shared)
                    else:
                        # The samples are written from the engine's own buffer: no copy here.
                        parts = protocol.audio_frame_parts(job.id, seq, rate, piece)
                        while not self._audio_slots.acquire(timeout=0.05):
                            if job.cancel.is_set():
                                return _cancelled(job)
                        post(self._queue_audio, job, parts)
                    seq += 1
                    samples += len(piece) // 2
            if job.cancel.is_set():
                return _cancelled(job)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        timings["synthesis"] = time.monotonic() - began
        timings["total"] = time.monotonic() - job.enqueued
        return Done(id=job.id, samples=samples, chunks=seq, sample_rate=rate, timings=timings)


class _LoadFailed(Exception):
    pass


def _shutting_down(job: _Job) -> Error:
    return Error(code="shutting_down", id=job.id, message="the sidecar is shutting down")


def _cancelled(job: _Job) -> Error:
    if job.cancel_code == "shutting_down":
        return _shutting_down(job)
    return Error(code="cancelled", id=job.id, message="cancelled while running")


def _error_for(request_id: int, exc: EngineError) -> Error:
    detail: dict[str, Any] = {}
    if exc.field is not None:
        detail["field"] = exc.field
    return Error(code=exc.code, id=request_id, message=str(exc), retryable=exc.retryable, detail=detail)


def _voices_reply(engine: Engine[Any, Any], request_id: int) -> protocol.Reply:
    """The answer to ``voices``, on the event loop thread: the engine lists them without loading."""
    try:
        voices = engine.voices()
    except Exception as exc:
        log.error("engine voice listing failed", exc_info=True)
        return Error(code="engine_error", id=request_id, message=f"{type(exc).__name__}: {exc}")
    if voices is None:
        return Error(
            code="invalid_input",
            id=request_id,
            message=f"engine {engine.name!r} has no named voices",
            detail={"field": "$.op"},
        )
    return Ok(id=request_id, info={"voices": voices})

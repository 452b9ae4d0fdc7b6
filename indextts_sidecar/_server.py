"""The sidecar server: one connection's reader and dispatcher, its queue, its jobs' output.

The event loop never runs engine code.  The reader decodes frames and answers
``ping`` and ``cancel`` at once; ``synthesize``, ``load`` and ``unload`` go into this
connection's bounded FIFO, from which the :class:`~._scheduler.Scheduler`'s engine
thread takes them, one at a time (:meth:`Server.run_job`, which runs
:func:`~._jobs.execute` with this server as the job's output).
Every frame leaves through the connection's :class:`~._outbox.Outbox`, so frames never
interleave; the engine thread writes its audio and terminal frames itself when the
stream takes them at once, without a turn of the event loop.

Over stdio there is one connection and one queue; a sidecar listening on a socket gives
every connection its own :class:`Server` (its own ids, its own queue) over one shared
scheduler.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from typing import TYPE_CHECKING, Any, Union

import anyio
import anyio.to_thread
import msgspec
from anyio.abc import ByteReceiveStream, ByteSendStream

from . import protocol
from ._jobs import error_for, execute, shutting_down
from ._outbox import Outbox
from ._paths import PathPolicy
from ._scheduler import Job, Scheduler
from .engines import Engine, EngineError, RequestError, SynthesisRequest
from .protocol import (
    REGISTERED_PREFIX,
    Cancel,
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
from .protocol.framing import FrameReader, FramingError

if TYPE_CHECKING:  # hashlib and tempfile load only for a sidecar that stores voices
    from ._voices import RegisteredVoices

__all__ = ["Scheduler", "Server"]

log = logging.getLogger("indextts_sidecar")

#: Exit codes, documented in docs/protocol.md.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FRAMING = 3

#: Longest ``text`` of a request, in characters (``--max-text``): about 1.5 hours of speech.
DEFAULT_MAX_TEXT = 100_000
#: Frames queued for the parent past which the reader stops reading requests (``--max-outgoing``).
DEFAULT_MAX_OUTGOING = 1024

_AUDIO_FRAME_BYTES = 4 * 1024 * 1024


class _Statm:
    """This process's resident memory, for ``pong``: one ``pread`` of ``/proc/self/statm`` (Linux)."""

    def __init__(self) -> None:
        self._page = 0
        #: Opened at the first ``pong``, kept for the life of the process; -1 where there is none.
        self._fd: Union[int, None] = None

    def rss(self) -> int:
        if self._fd is None:
            self._page = os.sysconf("SC_PAGE_SIZE")
            try:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = -1
        if self._fd >= 0:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


_statm = _Statm()


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
        max_text: int = DEFAULT_MAX_TEXT,
        max_outgoing: int = DEFAULT_MAX_OUTGOING,
        paths: Union[PathPolicy, None] = None,
        scheduler: Union[Scheduler, None] = None,
        voices: Union[RegisteredVoices, None] = None,
    ) -> None:
        self.engine = engine
        #: A server that makes its own scheduler runs and closes it; a shared one is its owner's.
        self._owns_scheduler = scheduler is None
        self.scheduler = scheduler if scheduler is not None else Scheduler(engine)
        self.voices = voices
        #: A ``register_voice`` read and not yet carried out: the read loop runs it in a thread.
        self._pending_voice: Union[RegisterVoice, None] = None
        self.paths = paths if paths is not None else PathPolicy()
        self.max_text = max_text
        self.max_outgoing = max_outgoing
        self.max_queue = max_queue
        self.max_frame_size = max_frame_size
        self.frame_timeout = frame_timeout
        self.shutdown_grace = shutdown_grace
        self._inflight: dict[int, Job] = {}
        #: Jobs waiting for the engine thread, and the one it runs (guarded by the scheduler's lock).
        self.queue: dict[int, Job] = {}
        self.active: Union[Job, None] = None
        #: Set by the engine thread when the active job ends, if the event loop waits for that.
        self._idle_waiter: Union[anyio.Event, None] = None
        self._outbox: Union[Outbox, None] = None
        #: PCM bytes per audio frame at most (the Output protocol of _jobs.py).
        self.frame_bytes = max(2, min(_AUDIO_FRAME_BYTES, (max_frame_size - 1024)) // 2 * 2)
        self._read_scope = anyio.CancelScope()
        self._shutdown_requested = False
        self._writer_done = anyio.Event()

    # ------------------------------------------------------------ output

    def send(self, message: protocol.Reply) -> None:
        """Send a frame that belongs to no running job's stream; never blocks, never waits behind audio."""
        outbox = self._outbox
        if outbox is not None:
            outbox.put((protocol.frame(message),))

    def _finish(self, job: Job, message: protocol.Reply) -> None:
        """Send ``job``'s terminal frame, unless it already has one.  From any thread."""
        with self.scheduler.lock:
            if job.finished:
                return
            job.finished = True
            self._inflight.pop(job.id, None)
            self.send(message)

    async def _writer(self, outbox: Outbox, stop: anyio.CancelScope) -> None:
        try:
            await outbox.run()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            # (A TLS stream reports a peer that closed as EndOfStream, also on send.)
            log.info("parent closed the reply stream; stopping")
            stop.cancel()
        finally:
            self._writer_done.set()

    # ------------------------------------------------------------- serve

    def stop(self) -> None:
        """End serving as if the input had ended (used for SIGTERM); safe to call twice."""
        self._read_scope.cancel()

    async def serve(
        self, receive: ByteReceiveStream, send: ByteSendStream, ready: Union[protocol.Ready, None] = None
    ) -> int:
        """Serve until shutdown, end of input or framing loss; return the exit code."""
        outbox = self._outbox = Outbox(send, max_outgoing=self.max_outgoing)
        reader = FrameReader(receive, max_frame_size=self.max_frame_size, frame_timeout=self.frame_timeout)
        code = EXIT_OK
        self.scheduler.attach(self)
        if ready is not None:  # the engine thread runs, and the reader starts just below
            self.send(ready)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._writer, outbox, self._read_scope)
                try:
                    with self._read_scope:
                        code = await self._read_loop(reader, outbox)
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop_jobs()
                        if code == EXIT_OK and not self._shutdown_requested:
                            # After every terminal frame: a request without one was never
                            # read, and the parent may send it to a new sidecar.
                            self.send(
                                Error(
                                    code="shutting_down",
                                    message="the sidecar is stopping; it read no request after those it ended",
                                )
                            )
                        outbox.close()
                        # The writer flushes what is queued, then ends.
                        with anyio.move_on_after(self.shutdown_grace):
                            await self._writer_done.wait()
                        tg.cancel_scope.cancel()
        finally:
            self.scheduler.detach(self)
            if self._owns_scheduler:
                self.scheduler.close()
            with anyio.CancelScope(shield=True):
                await outbox.aclose()
                await receive.aclose()
        return code

    async def _stop_jobs(self) -> None:
        """End every request with a terminal frame; give the running one a grace period."""
        with self.scheduler.lock:
            for job in list(self.queue.values()):
                del self.queue[job.id]
                self._finish(job, shutting_down(job))
            active = self.active
            idle = None
            if active is not None:
                active.cancel_code = "shutting_down"
                active.cancel.set()
                idle = self._idle_waiter = anyio.Event()
        if idle is not None:
            with anyio.move_on_after(self.shutdown_grace):
                await idle.wait()
        with self.scheduler.lock:
            for job in list(self._inflight.values()):
                self._finish(job, shutting_down(job))

    async def _read_loop(self, reader: FrameReader, outbox: Outbox) -> int:
        shutdown: list[Shutdown] = []

        def on_frame(body: memoryview) -> bool:
            """Handle one request frame; True stops the pump (a shutdown, or too much unwritten)."""
            message = self._on_frame(body)
            if isinstance(message, Shutdown):
                shutdown.append(message)
                return True
            return len(outbox) >= self.max_outgoing or self._pending_voice is not None

        while True:
            while len(outbox) >= self.max_outgoing:
                # The parent is not reading replies: stop reading requests (which make
                # more replies) until half the queue is written. The pipe then fills up,
                # and the parent's writes wait, instead of our memory growing.
                outbox.drained = anyio.Event()
                await outbox.drained.wait()
            try:
                stopped = await reader.pump(on_frame)
            except FramingError as exc:
                log.error("framing lost: %s", exc)
                self.send(Error(code=exc.code, message=f"{exc}; closing the connection", detail={"fatal": True}))
                return EXIT_FRAMING
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                stopped = False
            if not stopped:
                log.info("end of input: the parent closed the request stream")
                return EXIT_OK
            if self._pending_voice is not None:
                await self._register_voice(self._pending_voice)
                self._pending_voice = None
            if shutdown:
                self._shutdown_requested = True
                await self._stop_jobs()
                self.send(Ok(id=shutdown[0].id, info={"exit_code": EXIT_OK}))
                return EXIT_OK

    async def _register_voice(self, message: RegisterVoice) -> None:
        assert self.voices is not None
        # Shielded: its reply must go out, and the wait is bounded (one decode, one lock wait).
        with anyio.CancelScope(shield=True):
            try:
                info = await anyio.to_thread.run_sync(self.voices.register, message.name, message.audio)
            except EngineError as exc:
                self.send(error_for(message.id, exc))
                return
            except Exception as exc:  # a bug costs this request only, as in _on_frame
                log.exception("internal error registering voice %r", message.name)
                self.send(Error(code="internal", id=message.id, message=f"{type(exc).__name__}: {exc}"))
                return
        log.info("voice %r registered (%d bytes, sha256 %s)", message.name, info["bytes"], info["sha256"])
        self.send(Ok(id=message.id, info=info))

    def _on_frame(self, body: memoryview) -> Union[Shutdown, None]:
        """Decode and dispatch one request; a ``shutdown`` is returned for the read loop to carry out."""
        try:
            message = protocol.decode_request(body)
        except (msgspec.MsgspecError, RecursionError) as exc:
            # RecursionError: nested deeper than msgspec can follow. One bad message
            # costs that message only, never the connection.
            self._reject(protocol.describe_invalid(body, exc))
            return None
        if message.id in self._inflight:
            # Checked first, for every op: a ping, cancel or shutdown reusing a live
            # id would otherwise give that id a second terminal frame.
            self.send(
                Error(
                    code="duplicate_id",
                    message=f"request id {message.id} is already in flight",
                    detail={"field": "$.id"},
                )
            )
            return None
        if isinstance(message, Cancel) and message.target == message.id:
            self.send(
                Error(
                    code="invalid_message",
                    id=message.id,
                    message=f"cancel {message.id} names itself as its target",
                    detail={"field": "$.target"},
                )
            )
            return None
        if isinstance(message, Shutdown):
            return message
        try:
            self._dispatch(message)
        except Exception as exc:  # a bug (in the sidecar, or an engine's check()) costs this request only
            log.exception("internal error dispatching request %d", message.id)
            with self.scheduler.lock:
                self._inflight.pop(message.id, None)
                self.queue.pop(message.id, None)
            self.send(Error(code="internal", id=message.id, message=f"{type(exc).__name__}: {exc}"))
        return None

    # ----------------------------------------------------------- dispatch

    def _reject(self, error: Error) -> None:
        """Answer a message that could not be decoded."""
        if error.id is not None and error.id in self._inflight:
            error.id = None  # never a second terminal frame for a live id
        self.send(error)

    def _dispatch(self, message: protocol.Request) -> None:
        if isinstance(message, Ping):
            self.send(self._pong(message.id))
            return
        if isinstance(message, Cancel):
            found = self._cancel(message.target)
            self.send(Ok(id=message.id, info={"found": found}))
            return
        if isinstance(message, protocol.Voices):
            self.send(_voices_reply(self.engine, message.id))
            return
        if isinstance(message, RegisterVoice):
            if self.voices is None:
                self.send(
                    Error(
                        code="invalid_input",
                        id=message.id,
                        message="this sidecar stores no voices: start it with --voice-dir",
                        detail={"field": "$.audio"},
                    )
                )
                return
            # Decoding the clip takes up to a second: the read loop does it in a worker
            # thread, and reads this connection's next frame once it is answered.
            self._pending_voice = message
            return
        job: Job
        if isinstance(message, Synthesize):
            try:
                job = Job(message.id, "synthesize", self._synthesis_request(message), quiet=not message.progress)
            except EngineError as exc:
                self.send(error_for(message.id, exc))
                return
        elif isinstance(message, (Load, Unload)):
            job = Job(message.id, message.__struct_config__.tag)  # type: ignore[arg-type]
        else:  # pragma: no cover - the union is exhausted above
            raise AssertionError(message)
        with self.scheduler.lock:
            if len(self.queue) < self.max_queue:
                self._inflight[job.id] = job
                self.queue[job.id] = job
                self.scheduler.notify()
                return
            depth = len(self.queue)
        self.send(
            Error(
                code="busy",
                id=message.id,
                retryable=True,
                message=f"the request queue is full ({self.max_queue} waiting); retry later",
                detail={"queue_depth": depth},
            )
        )

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
        with self.scheduler.lock:
            job = self.queue.pop(target, None)
            if job is not None:
                self._finish(job, Error(code="cancelled", id=target, message="cancelled while queued"))
                return True
            active = self.active
            if active is not None and active.id == target and not active.finished:
                active.cancel.set()
                return True
        return False

    def _pong(self, request_id: int) -> Pong:
        memory = {"rss": _statm.rss()}
        try:
            memory.update(self.engine.memory())
        except Exception as exc:  # a broken memory report must not break health checks
            log.warning("engine memory report failed: %s", exc)
        active = self.active
        return Pong(
            id=request_id,
            loaded=self.engine.loaded,
            queue_depth=len(self.queue),
            active=None if active is None else active.id,
            memory=memory,
            uptime=round(time.monotonic() - self.scheduler.started, 3),
            dropped_options=list(self.engine.dropped_options),
        )

    # ------------------------------------------------------------- worker

    def run_job(self, job: Job) -> None:
        """Run one of this connection's jobs; on the engine thread (called by the scheduler)."""
        job.started = time.monotonic()
        try:
            terminal = execute(self.engine, job, self)
        except Exception as exc:  # a bug here must still end the request
            log.exception("internal error running request %d", job.id)
            terminal = Error(code="internal", id=job.id, message=f"{type(exc).__name__}: {exc}")
        with self.scheduler.lock:
            self.active = None
            self._finish(job, terminal)
            idle, self._idle_waiter = self._idle_waiter, None
        if idle is not None and self._outbox is not None:
            self._outbox.post(idle.set)

    # ------------------------------------------------- a running job's output

    def audio(self, job: Job, parts: tuple[bytes, memoryview]) -> bool:
        """An audio frame of a running job: written at once when no frame waits before it;
        otherwise queued once one of the outbox's audio slots is free (a slow parent).  A job
        that has its terminal frame already (shutdown) drops it.  False: cancelled meanwhile.
        """
        outbox = self._outbox
        if job.quiet:
            job.last_frame = time.monotonic()
        with self.scheduler.lock:
            if outbox is None or job.finished or outbox.put_if_free(parts):
                return True
        while not outbox.audio_slots.acquire(timeout=0.05):
            if job.cancel.is_set():
                return False
        with self.scheduler.lock:
            if not job.finished:
                outbox.put(parts, audio=True)
                return True
        outbox.audio_slots.release()
        return True

    def progress(self, job: Job, stage: str, fraction: Union[float, None], message: str) -> None:
        """A progress frame of a running job; from the engine thread or a heartbeat thread."""
        with self.scheduler.lock:
            if job.finished:
                return
            send = not job.quiet
            if not send and (now := time.monotonic()) - job.last_frame >= protocol.QUIET_PROGRESS_INTERVAL:
                job.last_frame = now  # a sign of life after a quiet spell
                send = True
            if send:
                self.send(Progress(id=job.id, stage=stage, fraction=fraction, message=message))
            if stage == "load":
                # Every request queued behind this one, on any connection, waits on the same load.
                for server in self.scheduler.servers:
                    for waiting in server.queue.values():
                        if waiting.kind == "synthesize":
                            server.send(Progress(id=waiting.id, stage=stage, fraction=fraction, message=message))


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

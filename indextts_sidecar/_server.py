"""The sidecar server: one connection's reader and dispatcher.

The event loop never runs engine code.  The reader decodes frames (through the
connection's :class:`~._wire.Wire`) and answers ``ping`` and ``cancel`` at once;
``synthesize``, ``load`` and ``unload`` are checked (:func:`~._validate.validate_synthesis`)
and go into this connection's bounded FIFO, a :class:`~._scheduler.Lane` the
:class:`~._scheduler.Scheduler` owns and its engine thread takes them from, one at a time,
running each with this connection's :class:`~._jobs.JobOutput`.
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
from anyio.abc import ByteReceiveStream, ByteSendStream

from . import protocol
from ._defaults import DEFAULT_FRAME_TIMEOUT, DEFAULT_MAX_OUTGOING, DEFAULT_MAX_QUEUE, DEFAULT_MAX_TEXT
from ._jobs import Job, JobOutput, error_for, shutting_down
from ._outbox import Outbox, WriteStalled
from ._paths import PathPolicy
from ._scheduler import Lane, Scheduler
from ._validate import RequestLimits, validate_synthesis
from ._wire import InvalidRequest, MsgpackWire, Wire
from .engines import Engine, EngineError
from .protocol import Cancel, Error, Load, Ok, Ping, Pong, RegisterVoice, Shutdown, Synthesize, Unload, Voices
from .protocol.framing import FrameReader, FramingError

if TYPE_CHECKING:  # hashlib and tempfile load only for a sidecar that stores voices
    from ._voices import RegisteredVoices

__all__ = ["DEFAULT_MAX_TEXT", "Scheduler", "Server"]

log = logging.getLogger("indextts_sidecar")

#: Exit codes, documented in docs/protocol.md.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FRAMING = 3


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
    """Serves one connection: any pair of anyio byte streams carrying protocol v1 (or another :class:`Wire`)."""

    def __init__(
        self,
        engine: Engine[Any, Any],
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE,
        frame_timeout: Union[float, None] = DEFAULT_FRAME_TIMEOUT,
        shutdown_grace: float = 0.5,
        max_text: int = DEFAULT_MAX_TEXT,
        max_outgoing: int = DEFAULT_MAX_OUTGOING,
        paths: Union[PathPolicy, None] = None,
        scheduler: Union[Scheduler, None] = None,
        voices: Union[RegisteredVoices, None] = None,
        write_timeout: Union[float, None] = None,
        path_voices: bool = True,
        drain_at_eof: bool = False,
        wire: Union[Wire, None] = None,
        batch_wait: float = 0.0,
    ) -> None:
        self.engine = engine
        #: A server that makes its own scheduler runs and closes it; a shared one is its owner's.
        self._owns_scheduler = scheduler is None
        self.scheduler = scheduler if scheduler is not None else Scheduler(engine, batch_wait=batch_wait)
        self.voices = voices
        self.wire: Wire = wire if wire is not None else MsgpackWire()
        #: A ``register_voice`` read and not yet carried out: the read loop runs it in a thread.
        self._pending_voice: Union[RegisterVoice, None] = None
        #: A job was queued on a one-at-a-time wire: the read loop reads on once it has ended.
        self._awaiting_answer = False
        self.limits = RequestLimits(
            max_text=max_text, paths=paths if paths is not None else PathPolicy(), path_voices=path_voices
        )
        self.max_outgoing = max_outgoing
        self.max_queue = max_queue
        self.max_frame_size = max_frame_size
        self.frame_timeout = frame_timeout
        self.shutdown_grace = shutdown_grace
        #: Seconds the connection may take no reply bytes (``--write-timeout``; None: no limit):
        #: then its running request is cancelled and it is closed, so that the engine thread,
        #: which waits for this connection's audio to go out, goes on to the others.
        self.write_timeout = write_timeout
        #: At the end of input, run what is queued before ending (input from a file, which
        #: ends where its writer stopped) instead of ending it ``shutting_down`` (a parent gone).
        self.drain_at_eof = drain_at_eof
        self._stalled = False
        #: The connection's request ids in flight (queued or running), each with its job.
        self._inflight: dict[int, Job] = {}
        #: Made by :meth:`serve`: the way out, what jobs write to, the queue at the scheduler.
        self._outbox: Union[Outbox, None] = None
        self._output: Union[JobOutput, None] = None
        self._lane: Union[Lane, None] = None
        self._read_scope = anyio.CancelScope()
        self._shutdown_requested = False
        self._writer_done = anyio.Event()

    # ------------------------------------------------------------ output

    def send(self, message: protocol.Reply) -> None:
        """Send a frame that belongs to no running job's stream; never blocks, never waits behind audio."""
        output = self._output
        if output is not None:
            output.send(message)

    async def _writer(self, outbox: Outbox, stop: anyio.CancelScope) -> None:
        try:
            await outbox.run()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            # (A TLS stream reports a peer that closed as EndOfStream, also on send.)
            log.info("parent closed the reply stream; stopping")
            stop.cancel()
        except WriteStalled as exc:
            self._close_stalled(str(exc))
        finally:
            self._writer_done.set()

    # ------------------------------------------------------------- serve

    def stop(self) -> None:
        """End serving as if the input had ended (used for SIGTERM); safe to call twice."""
        self._read_scope.cancel()

    def _close_stalled(self, why: str) -> None:
        """The connection reads no replies (``--write-timeout``): cancel its running request, close it.  Loop thread."""
        if self._stalled:
            return
        self._stalled = True
        log.warning("%s (--write-timeout); cancelling its requests and closing it", why)
        lane = self._lane
        running = None if lane is None else lane.running
        if lane is not None and running is not None:
            self.scheduler.cancel(lane, running.id)
        self._read_scope.cancel()

    async def serve(
        self, receive: ByteReceiveStream, send: ByteSendStream, ready: Union[protocol.Ready, None] = None
    ) -> int:
        """Serve until shutdown, end of input or framing loss; return the exit code."""
        outbox = self._outbox = Outbox(send, max_outgoing=self.max_outgoing, write_timeout=self.write_timeout)
        self._output = JobOutput(
            outbox,
            self.wire,
            self.scheduler,
            self._inflight,
            max_frame_size=self.max_frame_size,
            write_timeout=self.write_timeout,
            on_stalled=self._close_stalled,
        )
        reader = FrameReader(receive, max_frame_size=self.max_frame_size, frame_timeout=self.frame_timeout)
        code = EXIT_OK
        self._lane = lane = self.scheduler.attach(self._output)
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
            self.scheduler.detach(lane)
            if self._owns_scheduler:
                self.scheduler.close()
            with anyio.CancelScope(shield=True):
                await outbox.aclose()
                await receive.aclose()
        return code

    async def _stop_jobs(self) -> None:
        """End every request with a terminal frame; give the running one a grace period."""
        assert self._lane is not None and self._output is not None
        idle = self.scheduler.stop_all(self._lane)
        if idle is not None:
            with anyio.move_on_after(self.shutdown_grace):
                await idle.wait()
        with self.scheduler.lock:
            for job in list(self._inflight.values()):
                self._output.finish(job, shutting_down(job))

    async def _wait_idle(self) -> None:
        """Until no job of this connection is queued or running."""
        assert self._lane is not None
        while (idle := self.scheduler.until_idle(self._lane)) is not None:
            await idle.wait()

    async def _read_loop(self, reader: FrameReader, outbox: Outbox) -> int:
        shutdown: list[Shutdown] = []

        def on_frame(body: memoryview) -> bool:
            """Handle one request frame; True stops the pump (a shutdown, too much unwritten, a wait)."""
            message = self._on_frame(body)
            if isinstance(message, Shutdown):
                shutdown.append(message)
                return True
            return len(outbox) >= self.max_outgoing or self._pending_voice is not None or self._awaiting_answer

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
                if self.drain_at_eof:
                    log.info("end of the request file: running what it queued, then stopping")
                    await self._wait_idle()
                else:
                    log.info("end of input: the parent closed the request stream")
                return EXIT_OK
            if self._pending_voice is not None:
                await self._register_voice(self._pending_voice)
                self._pending_voice = None
            if self._awaiting_answer:
                await self._wait_idle()
                self._awaiting_answer = False
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
            message = self.wire.decode(body)
        except InvalidRequest as exc:
            # One bad message costs that message only, never the connection.
            self._reject(exc.error)
            return None
        if self._live(message.id):
            # Checked first, for every op: a ping, cancel or shutdown reusing a live
            # id would otherwise give that id a second terminal frame.  The id goes in
            # ``detail``: an ``id`` would end the live request.
            self.send(
                Error(
                    code="duplicate_id",
                    message=f"request id {message.id} is already in flight",
                    detail={"field": "$.id", "id": message.id},
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
            error = Error(code="internal", id=message.id, message=f"{type(exc).__name__}: {exc}")
            if message.id not in self._inflight:
                self.send(error)
            else:  # a waiting job ends with the error; one the engine thread took ends as cancelled, in order
                assert self._lane is not None
                self.scheduler.cancel(self._lane, message.id, reason=error)
        return None

    def _live(self, request_id: int) -> bool:
        """Whether ``request_id`` is in flight, read under the scheduler's lock.

        :meth:`JobOutput.finish` queues a job's terminal frame and frees its id under that
        lock, in that order: read without it, an id whose terminal frame the parent has read
        already (the frame is written to the stream as it is queued) could still look live.
        """
        with self.scheduler.lock:
            return request_id in self._inflight

    # ----------------------------------------------------------- dispatch

    def _reject(self, error: Error) -> None:
        """Answer a message that could not be decoded."""
        if error.id is not None and self._live(error.id):
            # Never a second terminal frame for a live id; ``detail.id`` still names it.
            error.detail = {**error.detail, "id": error.id}
            error.id = None
        self.send(error)

    def _dispatch(self, message: protocol.Request) -> None:
        """Answer ``message`` at once (ping, cancel, voices), or queue its job."""
        assert self._lane is not None
        match message:
            case Synthesize():  # first: the most frequent
                try:
                    request = validate_synthesis(self.engine, message, self.limits, self.voices)
                except EngineError as exc:
                    self.send(error_for(message.id, exc))
                    return
                self._queue(Job(message.id, "synthesize", request, progress_wanted=message.progress))
            case Ping(id=request_id):
                self.send(self._pong(request_id))
            case Cancel(id=request_id, target=target):
                found = self.scheduler.cancel(self._lane, target)
                self.send(Ok(id=request_id, info={"found": found}))
            case Voices(id=request_id):
                self.send(_voices_reply(self.engine, request_id))
            case RegisterVoice():
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
            case Load(id=request_id):
                self._queue(Job(request_id, "load"))
            case Unload(id=request_id):
                self._queue(Job(request_id, "unload"))
            case Shutdown():  # pragma: no cover - _on_frame hands it to the read loop
                raise AssertionError(message)

    def _queue(self, job: Job) -> None:
        """Queue ``job`` on this connection's lane, or answer ``busy``."""
        assert self._lane is not None
        # Live before it is queued: the engine thread may end it at once.
        self._inflight[job.id] = job
        depth = self.scheduler.enqueue(self._lane, job, self.max_queue)
        if depth is None:
            if self.wire.one_at_a_time:
                self._awaiting_answer = True
            return
        del self._inflight[job.id]
        self.send(
            Error(
                code="busy",
                id=job.id,
                retryable=True,
                message=f"the request queue is full ({self.max_queue} waiting); retry later",
                detail={"queue_depth": depth},
            )
        )

    def _pong(self, request_id: int) -> Pong:
        assert self._lane is not None
        memory = {"rss": _statm.rss()}
        try:
            memory.update(self.engine.memory())
        except Exception as exc:  # a broken memory report must not break health checks
            log.warning("engine memory report failed: %s", exc)
        running = self._lane.running
        return Pong(
            id=request_id,
            loaded=self.engine.loaded,
            queue_depth=self._lane.depth,
            active=None if running is None else running.id,
            memory=memory,
            uptime=round(time.monotonic() - self.scheduler.started, 3),
            dropped_options=list(self.engine.dropped_options),
        )


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

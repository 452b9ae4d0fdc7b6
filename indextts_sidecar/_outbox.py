"""The way out of one connection: frames from the event loop and the engine thread, in order.

Frames come from two threads: control answers (``pong``, errors) from the event loop,
audio, progress and terminal frames from the engine thread.  Each frame goes out whole
and in the order it was put, never interleaved with another.

Fast path: when nothing is waiting to be written and the stream can write without
blocking (a pipe: :class:`~.protocol.streams.NonBlockingSend`), the producing thread writes the
frame itself, at once: no hand-off to the event loop, no task switch.  Whatever does not
fit (a full pipe, a slow parent) waits in the backlog, which one writer task on the event
loop drains; while the backlog holds anything, every frame joins it, so order holds.
Streams without a non-blocking write (sockets, TLS) always go through the writer task.

An audio frame that has to wait (the pipe is full, frames are queued) first takes one of
a few slots, given back once it is written: that bounds the memory audio can take when the
parent reads slowly (the slots, plus the rest of at most one frame written in part).
Control frames never wait for a slot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Union

import anyio
from anyio.abc import ByteSendStream
from anyio.lowlevel import current_token

from .protocol.framing import FrameWriter
from .protocol.streams import NonBlockingSend

__all__ = ["LoopPoster", "Outbox"]

log = logging.getLogger("indextts_sidecar")

_Part = Union[bytes, memoryview]
#: Audio frames waiting for the parent at most; the engine thread waits for a slot.
AUDIO_SLOTS = 4
#: Frames queued meanwhile go out in one writev, up to this many bytes.
_BATCH_BYTES = 1 << 20
#: With a write deadline, bytes written under one deadline at most: the deadline bounds how
#: long a connection may take none of them, not how long a large frame may take in all.
_DEADLINE_BYTES = 256 * 1024


class WriteStalled(Exception):
    """The stream took none of the bytes offered within the outbox's ``write_timeout``."""


class LoopPoster:
    """Schedules a callback on the current event loop from any thread, without waiting.

    ``anyio.from_thread.run_sync`` waits for the loop to run the callback; the engine
    thread only needs its callbacks queued in order, so it hands them over with the
    backend's own thread-safe ``call_soon``.  Create it on the event loop's thread.
    """

    def __init__(self) -> None:
        native: Any = current_token().native_token
        # asyncio: the loop's call_soon_threadsafe; trio: TrioToken.run_sync_soon.
        self._post: Callable[[Callable[[], None]], object] = getattr(native, "call_soon_threadsafe", None) or (
            native.run_sync_soon
        )
        self.loop_thread = threading.get_ident()

    def __call__(self, fn: Callable[..., None], *args: Any) -> None:
        def guarded() -> None:
            try:
                fn(*args)
            except Exception:  # a callback must never take the event loop down
                log.exception("internal error in a callback from another thread")

        try:
            self._post(guarded)
        except Exception:  # the event loop has ended: nobody is listening
            pass

    def soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` now if this is the loop's thread, else post it there."""
        if threading.get_ident() == self.loop_thread:
            fn()
        else:
            self(fn)


def _rest(parts: Sequence[_Part], written: int) -> list[_Part]:
    """What remains of ``parts`` after ``written`` bytes."""
    rest: list[_Part] = []
    for part in parts:
        if written >= len(part):
            written -= len(part)
            continue
        rest.append(memoryview(part).cast("B")[written:] if written else part)
        written = 0
    return rest


class Outbox:
    """Frames of one connection, written in order from any thread (see the module doc)."""

    def __init__(self, stream: ByteSendStream, *, max_outgoing: int, write_timeout: Union[float, None] = None) -> None:
        self._writer = FrameWriter(stream)
        #: Seconds a write may make no progress before :meth:`run` raises :class:`WriteStalled`.
        self.write_timeout = write_timeout
        #: ``time.monotonic()`` when bytes were last written (or the outbox made): what the
        #: engine thread, waiting for an audio slot, measures a stall from.
        self.progressed = time.monotonic()
        #: The stream, where it writes from the producing thread (checked once, here).
        self._direct: Union[NonBlockingSend, None] = stream if isinstance(stream, NonBlockingSend) else None
        self._lock = threading.Lock()
        #: Frames not yet written (parts, holds an audio slot); only the writer task removes them.
        self._backlog: deque[tuple[Sequence[_Part], bool]] = deque()
        self._closed = False
        self._writer_waits = False
        self._wake = anyio.Event()
        self._post = LoopPoster()
        self.max_outgoing = max_outgoing
        self.drained = anyio.Event()
        self.audio_slots = threading.Semaphore(AUDIO_SLOTS)

    def __len__(self) -> int:
        """Frames waiting to be written."""
        return len(self._backlog)

    @property
    def post(self) -> LoopPoster:
        """Runs callbacks on the event loop of this connection, from any thread."""
        return self._post

    def put_if_free(self, parts: Sequence[_Part]) -> bool:
        """Write a frame now if no frame waits before it; False (nothing done) otherwise.

        What the stream does not take at once is queued (True all the same): a producer
        that holds no audio slot for it puts at most one such frame past the slots.
        """
        return self._put(parts, audio=False, only_if_free=True)

    def put(self, parts: Sequence[_Part], audio: bool = False) -> None:
        """Write a frame, or queue it behind those waiting; from any thread, never blocks.

        ``audio``: the frame holds an audio slot, released once it is written (or dropped).
        After :meth:`close` frames are dropped.
        """
        self._put(parts, audio=audio, only_if_free=False)

    def _put(self, parts: Sequence[_Part], *, audio: bool, only_if_free: bool) -> bool:
        """Write ``parts`` at once if nothing waits, queue the rest; False when ``only_if_free`` declined."""
        with self._lock:
            if self._closed:
                if audio:
                    self.audio_slots.release()
                return True  # dropped
            if self._backlog or self._direct is None:
                if only_if_free:
                    return False
            else:
                try:
                    written = self._direct.try_send_parts(parts)
                except Exception:  # a broken stream, or one that lacks the write it declared: the writer task has it
                    written = 0
                if written == sum(map(len, parts)):
                    if audio:
                        self.audio_slots.release()
                    return True
                parts = _rest(parts, written)
            self._backlog.append((parts, audio))
            wake, self._writer_waits = self._writer_waits, False
        if wake:
            self._post.soon(self._wake.set)
        return True

    def close(self) -> None:
        """No more frames; the writer task writes what is queued, then ends.  Loop thread only."""
        with self._lock:
            self._closed = True
            wake, self._writer_waits = self._writer_waits, False
        if wake:
            self._wake.set()

    async def run(self) -> None:
        """The writer task: drain the backlog until closed and empty.  Raises what the stream raises."""
        while True:
            with self._lock:
                count = 0
                if not self._backlog:
                    if self._closed:
                        return
                    self._wake = wake = anyio.Event()
                    self._writer_waits = True
                else:
                    batch: list[_Part] = []
                    size = 0
                    for parts, _ in self._backlog:
                        if size >= _BATCH_BYTES:
                            break
                        batch.extend(parts)
                        size += sum(map(len, parts))
                        count += 1
            if not count:
                await wake.wait()
                continue
            if self.write_timeout is None:
                await self._writer.send_parts(batch)
            else:
                await self._send_with_deadline(batch)
            self.progressed = time.monotonic()
            with self._lock:
                for _ in range(count):
                    _, audio = self._backlog.popleft()
                    if audio:
                        self.audio_slots.release()
                backlog = len(self._backlog)
            if backlog <= self.max_outgoing // 2:
                self.drained.set()

    async def _send_with_deadline(self, parts: Sequence[_Part]) -> None:
        """Write ``parts`` in pieces of at most ``_DEADLINE_BYTES``, each within ``write_timeout`` seconds."""
        piece: list[_Part] = []
        size = 0
        for part in parts:
            view = memoryview(part).cast("B")
            while view:
                take = view[: _DEADLINE_BYTES - size]
                piece.append(take)
                size += len(take)
                view = view[len(take) :]
                if size == _DEADLINE_BYTES:
                    await self._send_piece(piece)
                    piece, size = [], 0
        if piece:
            await self._send_piece(piece)

    async def _send_piece(self, piece: list[_Part]) -> None:
        timeout = self.write_timeout
        assert timeout is not None
        with anyio.move_on_after(timeout) as scope:
            await self._writer.send_parts(piece)
        if scope.cancelled_caught:
            raise WriteStalled(f"the connection took no reply bytes for {timeout:g} s")
        self.progressed = time.monotonic()

    def stalled_for(self, since: float) -> float:
        """Seconds, as of now, since the later of ``since`` and the last bytes written."""
        return time.monotonic() - max(since, self.progressed)

    async def aclose(self) -> None:
        """Close the stream; frames put from now on are dropped (no thread writes to a closed fd)."""
        with self._lock:
            self._closed = True
        await self._writer.aclose()

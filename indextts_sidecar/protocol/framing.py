"""Length-prefixed frames over any anyio byte stream (shared by the sidecar and the client)."""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Union, cast

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from indextts_sidecar import protocol

from .streams import ReadinessCallback, ReceiveInto, VectoredSend, loop_clock

__all__ = ["FrameReader", "FrameSplitter", "FrameTooLarge", "FrameWriter", "FramingError", "TruncatedFrame"]

#: Bytes asked of one read of :meth:`FrameReader.pump`, into a buffer the reader keeps and
#: reads into again and again (a fresh buffer per read cost an allocation and, depending on
#: what the process had freed before, page faults).  A megabyte measured the same.  Frames
#: larger than what one read brings are read straight into their own buffer (``pending_into``).
_READ_SIZE = 120 * 1024
#: Reads one readiness wake-up of :meth:`FrameReader.pump` may make while each fills what it asked for.
_READS_PER_WAKE = 8
#: Frame bodies from this size on get a buffer that is not zero-filled (see _frame_buffer).
_UNFILLED_FROM = 256 * 1024


class FramingError(Exception):
    """The byte stream no longer splits into frames; the connection cannot continue."""

    code = "internal"


class FrameTooLarge(FramingError):
    code = "frame_too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class TruncatedFrame(FramingError):
    code = "truncated_frame"

    def __init__(self, received: int, expected: Union[int, None], reason: str) -> None:
        want = "a 4-byte length prefix" if expected is None else f"{expected} bytes"
        super().__init__(f"stream {reason} after {received} bytes of a frame that needs {want}")
        self.received = received
        self.expected = expected
        #: Whether the stream ended inside the frame (its writer is gone), not stalled in it.
        self.ended = reason == "ended"


class FrameSplitter:
    """Cuts a byte stream into frame bodies; no I/O, so any reader (and any thread) can drive it.

    Small frames are handed out as views of the bytes read (no copy).  A frame that
    does not arrive whole gets its own buffer; :meth:`pending_into` names where the rest
    of it can be read straight into (one copy, large reads).
    """

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        #: Bytes of a frame not yet complete (a partial length prefix), or of none.
        self._head = b""
        self._body: Union[memoryview, None] = None
        self._filled = 0

    @property
    def inside(self) -> bool:
        """Whether a frame has started and is not complete."""
        return self._body is not None or bool(self._head)

    def progress(self) -> tuple[int, Union[int, None]]:
        """Bytes of the current frame received (prefix included), and its body size if known."""
        if self._body is not None:
            return protocol.HEADER + self._filled, len(self._body)
        return len(self._head), None

    def pending_into(self) -> Union[memoryview, None]:
        """The rest of a started frame's body, to read straight into; then call :meth:`filled`."""
        return None if self._body is None else self._body[self._filled :]

    def filled(self, count: int, frames: list[memoryview]) -> None:
        """``count`` bytes were read into :meth:`pending_into`; the frame goes to ``frames`` once whole."""
        assert self._body is not None
        self._filled += count
        if self._filled == len(self._body):
            frames.append(self._body)
            self._body = None

    def feed(self, data: Union[bytes, memoryview], frames: list[memoryview]) -> None:
        """Add bytes read; append each frame they complete to ``frames``.

        Raises :class:`FrameTooLarge` for a prefix above the limit (the stream is lost);
        the frames before it are in ``frames`` all the same.
        """
        if self._body is not None:
            take = min(len(data), len(self._body) - self._filled)
            self._body[self._filled : self._filled + take] = data[:take]
            self.filled(take, frames)
            if take == len(data):
                return
            data = bytes(data[take:])
        if self._head:
            data = self._head + bytes(data)
            self._head = b""
        view = memoryview(data)
        end_of_data = len(data)
        pos = 0
        while end_of_data - pos >= protocol.HEADER:
            size = int.from_bytes(view[pos : pos + protocol.HEADER], "big")
            if size > self.max_frame_size:
                raise FrameTooLarge(size, self.max_frame_size)
            start = pos + protocol.HEADER
            end = start + size
            if end <= end_of_data:
                frames.append(view[start:end])
                pos = end
                continue
            body = _frame_buffer(size)
            body[: end_of_data - start] = view[start:]
            self._body, self._filled = body, end_of_data - start
            return
        if pos < end_of_data:
            self._head = bytes(view[pos:])


def _frame_buffer(size: int) -> memoryview:
    """Room for one frame body that arrives in more than one read.

    A large one is not zero-filled first (``bytearray`` would write every byte once before
    the read writes it again: 0.1 ms for 60 s of audio); numpy is imported for it then, and
    only then, so a sidecar that never receives one never imports it.
    """
    if size < _UNFILLED_FROM:
        return memoryview(bytearray(size))
    import numpy

    return numpy.empty(size, dtype=numpy.uint8).data


class FrameReader:
    """Reads frames from ``stream``.

    A frame that has started must be complete within ``frame_timeout`` seconds; a
    stream that stalls inside a frame raises :class:`TruncatedFrame` instead of
    waiting forever (and of eating the next frame as the stalled one's tail).
    Between frames the reader waits as long as it takes.

    :meth:`receive` hands out one frame; :meth:`pump` hands each frame to a function as
    it arrives, which on a pipe (:class:`~.streams.FdReceiveStream`) runs straight from
    the event loop's readiness callback: no task switch and no re-registration per read.
    """

    def __init__(
        self,
        stream: ByteReceiveStream,
        *,
        max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE,
        frame_timeout: Union[float, None] = None,
    ) -> None:
        self._stream = stream
        #: The stream's faster ways in, where it declares them (see .streams).
        self._into: Union[ReceiveInto, None] = stream if isinstance(stream, ReceiveInto) else None
        self._readiness: Union[ReadinessCallback, None] = stream if isinstance(stream, ReadinessCallback) else None
        self._splitter = FrameSplitter(max_frame_size)
        self._timeout = math.inf if frame_timeout is None else frame_timeout
        #: Complete frames not yet handed out.
        self._ready: deque[memoryview] = deque()
        #: When the frame now started began to arrive.
        self._started = math.inf
        #: The event loop's clock, set when reading starts (callable outside a task).
        self._clock: Union[Callable[[], float], None] = None
        #: Framing lost after the frames in ``_ready``: raised once they are handed out.
        self._failed: Union[FramingError, None] = None
        #: What :meth:`pump` reads into, again and again (allocated at its first use).
        self._buffer: Union[bytearray, None] = None

    def shares(self, view: memoryview) -> bool:
        """Whether ``view`` lies in the buffer :meth:`pump` reads into (valid until ``on_frame`` returns)."""
        return self._buffer is not None and view.obj is self._buffer

    def _own_ready(self) -> None:
        """Copy the frames not yet handed out out of the shared buffer, before it is read into again."""
        self._ready = deque(memoryview(bytes(body)) if self.shares(body) else body for body in self._ready)

    @property
    def max_frame_size(self) -> int:
        return self._splitter.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        self._splitter.max_frame_size = value

    def _truncated(self, reason: str) -> TruncatedFrame:
        received, expected = self._splitter.progress()
        return TruncatedFrame(received, expected, reason)

    def _took(self, frames: list[memoryview]) -> None:
        self._ready.extend(frames)
        if not self._splitter.inside:
            self._started = math.inf
        elif frames or self._started == math.inf:
            assert self._clock is not None  # set by receive() or pump(), which call this
            self._started = self._clock()  # a new frame started

    async def _read_more(self) -> bool:
        """One read from the stream into the splitter; False at the end of the stream."""
        frames: list[memoryview] = []
        into = self._splitter.pending_into()
        try:
            if into is not None and self._into is not None:
                self._splitter.filled(await self._into.receive_into(into), frames)
            else:
                self._feed(await self._stream.receive(), frames)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        self._took(frames)
        return True

    def _feed(self, data: Union[bytes, memoryview], frames: list[memoryview]) -> None:
        try:
            self._splitter.feed(data, frames)
        except FramingError as exc:
            # Raised once the frames before it are handed out.
            self._failed = exc

    async def _fill(self) -> bool:
        """Until a frame is ready; False at a clean end of stream between frames."""
        while not self._ready:
            if self._failed is not None:
                raise self._failed
            if not self._splitter.inside:
                if not await self._read_more():
                    return False
                continue
            with anyio.move_on_at(self._started + self._timeout):
                if not await self._read_more():
                    raise self._truncated("ended")
                continue
            raise self._truncated(f"stalled for {self._timeout:g} s")
        return True

    async def receive(self) -> Union[memoryview, None]:
        """The next frame's body, or None at a clean end of stream between frames."""
        if self._clock is None:
            self._clock = loop_clock()
        if not self._ready and not await self._fill():
            return None
        return self._ready.popleft()

    async def pump(self, on_frame: Callable[[memoryview], bool]) -> bool:
        """Hand each frame to ``on_frame`` as it arrives, until it returns True (then True).

        The frame may be a view of the buffer the pump reads into again: it is valid until
        ``on_frame`` returns, so what is kept of it must be copied (:meth:`shares` tells).

        Returns False at a clean end of stream between frames.  ``on_frame`` runs
        synchronously, maybe from the event loop's readiness callback, outside any task:
        it must not block, and must not call what needs a current task (anyio's clock:
        :func:`~.streams.loop_clock`; starting tasks: stop the pump and do it after).
        The frames after the one that stopped the pump stay for the next call.
        """
        if self._clock is None:
            self._clock = loop_clock()
        while self._ready:
            if on_frame(self._ready.popleft()):
                return True
        if self._failed is not None:
            raise self._failed
        if self._readiness is None:
            return await self._pump_receiving(on_frame)
        return await self._pump_when_readable(self._readiness, on_frame)

    async def _pump_receiving(self, on_frame: Callable[[memoryview], bool]) -> bool:
        """:meth:`pump` over a stream without a readiness callback: one :meth:`receive` a frame."""
        while True:
            body = await self.receive()
            if body is None:
                return False
            if on_frame(body):
                return True

    async def _pump_when_readable(self, readiness: ReadinessCallback, on_frame: Callable[[memoryview], bool]) -> bool:
        """:meth:`pump` from the event loop's readiness callback, reading the descriptor itself."""
        fd = readiness.fileno()
        splitter = self._splitter
        outcome: list[bool] = []

        if self._buffer is None:
            self._buffer = bytearray(_READ_SIZE)
        shared = memoryview(self._buffer)

        def readable() -> Union[float, None]:
            # Called each time the descriptor is readable.  Reads into the one shared buffer
            # (whole frames are views of it, valid until on_frame returns), and reads on while
            # a read fills what it asked for: one wake-up takes a burst of frames.
            for _ in range(_READS_PER_WAKE):
                frames: list[memoryview] = []
                into = splitter.pending_into()
                try:
                    if into is not None:
                        wanted = len(into)
                        count = os.readv(fd, [into])
                        if count:
                            splitter.filled(count, frames)
                    else:
                        wanted = _READ_SIZE
                        count = os.readv(fd, [shared])
                        if count:
                            self._feed(shared[:count], frames)
                except BlockingIOError:
                    return self._deadline()
                except OSError:
                    count = 0
                if not count:
                    if splitter.inside:
                        raise self._truncated("ended")
                    outcome.append(False)
                    return None
                self._took(frames)
                ready = self._ready
                while ready:
                    if on_frame(ready.popleft()):
                        self._own_ready()
                        outcome.append(True)
                        return None
                if self._failed is not None:
                    raise self._failed
                if count < wanted:
                    break
            return self._deadline()

        try:
            await readiness.when_readable(readable, self._deadline())
        except TimeoutError:
            raise self._truncated(f"stalled for {self._timeout:g} s") from None
        return outcome[0] if outcome else False

    def _deadline(self) -> float:
        """Until when the next read may wait (a started frame must finish in time)."""
        return self._started + self._timeout if self._splitter.inside else math.inf


class FrameWriter:
    """Writes frames to ``stream``.  One writer per stream: callers serialise sends."""

    def __init__(self, stream: ByteSendStream) -> None:
        self._stream = stream
        self._vectored: Union[VectoredSend, None] = stream if isinstance(stream, VectoredSend) else None

    async def send(self, message: Union[protocol.Request, protocol.Reply]) -> None:
        await self._stream.send(protocol.frame(message))

    async def send_parts(self, parts: Sequence[Union[bytes, memoryview]]) -> None:
        """Write ``parts`` back to back: with one ``writev`` where the stream offers it."""
        if self._vectored is not None:
            await self._vectored.send_parts(parts)
            return
        for part in parts:
            # anyio's byte streams take any bytes-like object; only the annotation says bytes.
            await self._stream.send(cast(bytes, part))

    async def aclose(self) -> None:
        await self._stream.aclose()

"""Length-prefixed frames over any anyio byte stream (shared by the sidecar and the client)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Union, cast

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream

from indextts_sidecar import protocol

__all__ = ["FrameReader", "FrameTooLarge", "FrameWriter", "FramingError", "TruncatedFrame"]


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


class FrameReader:
    """Reads frames from ``stream``.

    A frame that has started must be complete within ``frame_timeout`` seconds; a
    stream that stalls inside a frame raises :class:`TruncatedFrame` instead of
    waiting forever (and of eating the next frame as the stalled one's tail).
    Between frames the reader waits as long as it takes.
    """

    def __init__(
        self,
        stream: ByteReceiveStream,
        *,
        max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE,
        frame_timeout: Union[float, None] = None,
    ) -> None:
        self._stream = stream
        self.max_frame_size = max_frame_size
        self._timeout = math.inf if frame_timeout is None else frame_timeout
        self._buffer: bytes = b""
        self._pos = 0

    async def _more(self, deadline: float, received: int, expected: Union[int, None], want: int) -> bytes:
        with anyio.move_on_after(deadline - anyio.current_time()) as scope:
            try:
                return await self._stream.receive(max(want, 65536))
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise TruncatedFrame(received, expected, "ended") from None
        assert scope.cancel_called
        raise TruncatedFrame(received, expected, f"stalled for {self._timeout:g} s")

    async def _more_into(
        self, receive_into: Callable[[memoryview], Awaitable[int]], deadline: float, view: memoryview, size: int
    ) -> int:
        with anyio.move_on_after(deadline - anyio.current_time()) as scope:
            try:
                return await receive_into(view)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise TruncatedFrame(protocol.HEADER + size - len(view), size, "ended") from None
        assert scope.cancel_called
        raise TruncatedFrame(protocol.HEADER + size - len(view), size, f"stalled for {self._timeout:g} s")

    async def receive(self) -> Union[memoryview, None]:
        """The next frame's body, or None at a clean end of stream between frames."""
        data, pos = self._buffer, self._pos
        if pos == len(data):
            try:
                data, pos = await self._stream.receive(), 0
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return None
        deadline = anyio.current_time() + self._timeout
        if len(data) - pos < protocol.HEADER:
            data, pos = data[pos:], 0
            while len(data) < protocol.HEADER:
                data += await self._more(deadline, len(data), None, protocol.HEADER - len(data))
        size = int.from_bytes(data[pos : pos + protocol.HEADER], "big")
        if size > self.max_frame_size:
            self._buffer, self._pos = b"", 0
            raise FrameTooLarge(size, self.max_frame_size)
        start = pos + protocol.HEADER
        end = start + size
        if len(data) >= end:
            # The whole frame is buffered: hand out a view, no copy.
            self._buffer, self._pos = data, end
            return memoryview(data)[start:end]
        body = bytearray(size)
        filled = len(data) - start
        body[:filled] = memoryview(data)[start:]
        self._buffer, self._pos = b"", 0
        receive_into = getattr(self._stream, "receive_into", None)
        if receive_into is not None:
            # Read the rest straight into the frame's buffer: one copy, large reads.
            view = memoryview(body)
            while filled < size:
                filled += await self._more_into(receive_into, deadline, view[filled:], size)
            return view
        while filled < size:
            chunk = await self._more(deadline, protocol.HEADER + filled, size, size - filled)
            take = min(len(chunk), size - filled)
            body[filled : filled + take] = memoryview(chunk)[:take]
            filled += take
            if take < len(chunk):
                self._buffer, self._pos = chunk, take
        return memoryview(body)


class FrameWriter:
    """Writes frames to ``stream``.  One writer per stream: callers serialise sends."""

    def __init__(self, stream: ByteSendStream) -> None:
        self._stream = stream

    async def send(self, message: Union[protocol.Request, protocol.Reply]) -> None:
        await self._stream.send(protocol.frame(message))

    async def send_parts(self, parts: Sequence[Union[bytes, memoryview]]) -> None:
        """Write ``parts`` back to back: with one ``writev`` where the stream offers it."""
        send_parts = getattr(self._stream, "send_parts", None)
        if send_parts is not None:
            await send_parts(parts)
            return
        for part in parts:
            # anyio's byte streams take any bytes-like object; only the annotation says bytes.
            await self._stream.send(cast(bytes, part))

    async def aclose(self) -> None:
        await self._stream.aclose()

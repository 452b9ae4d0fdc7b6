"""The one writer of a connection: frames go out whole, one at a time, never interleaved."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Union

import anyio
from anyio.abc import ByteSendStream

from indextts_sidecar.protocol.streams import NonBlockingSend

from ._exchange import Exchange

__all__ = ["FrameSender"]


class FrameSender:
    """The one writer of a connection: frames go out whole, one at a time, never interleaved.

    Fast path: when nothing else is writing and the stream takes the whole frame at once
    (a pipe nearly always does for a request), it is written without an await, so no lock
    round trip and no cancel scopes.  Otherwise, or for what did not fit, the frame goes
    out under the lock, shielded from cancellation once started (a half-written frame
    would break framing), bounded by ``frame_timeout``.
    """

    def __init__(self, stream: ByteSendStream, frame_timeout: Union[float, None]) -> None:
        self.stream = stream
        #: Where the stream declares a non-blocking write (a pipe), checked once, here.
        self._try_send: Union[Callable[[bytes], int], None] = (
            stream.try_send if isinstance(stream, NonBlockingSend) else None
        )
        self._limit = math.inf if frame_timeout is None else frame_timeout
        self._lock = anyio.Lock()
        #: The event loop's clock (the connection sets it once running).
        self.clock: Callable[[], float] = anyio.current_time

    async def send(
        self, data: bytes, exchange: Union[Exchange, None], check: Callable[[Union[Exchange, None]], None]
    ) -> Union[str, None]:
        """Write ``data``; returns what failed (the stream broke or stalled), else None.

        ``check`` raises when nothing may be sent any more; it runs before writing, under
        the lock.
        """
        check(exchange)
        if self._try_send is not None and not self._lock.locked():
            # Nothing awaits between the check and the write: no other task can write in between.
            if exchange is not None:
                exchange.sent_at = self.clock()
            try:
                written = self._try_send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                written = 0  # the slow path reports it
            if written == len(data):
                if exchange is not None:
                    exchange.mark_sent()
                return None
            self._lock.acquire_nowait()  # before any await: the rest of this frame goes next
            try:
                return await self._write(data[written:], exchange)
            finally:
                self._lock.release()
        async with self._lock:
            check(exchange)
            return await self._write(data, exchange)

    async def send_raw(self, data: bytes) -> Union[str, None]:
        """A frame outside any request (the handshake's answer)."""
        async with self._lock:
            return await self._write(data, None)

    async def _write(self, data: bytes, exchange: Union[Exchange, None]) -> Union[str, None]:
        failure: Union[str, None] = None
        with anyio.CancelScope(shield=True):
            if exchange is not None:
                exchange.sent_at = anyio.current_time()
            with anyio.move_on_after(self._limit) as scope:
                try:
                    await self.stream.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    failure = f"writing to the sidecar failed: {exc!r}"
            if scope.cancelled_caught:
                failure = f"writing a frame to the sidecar stalled for {self._limit:g} s"
            elif failure is None and exchange is not None:
                exchange.mark_sent()
        return failure

"""Non-blocking anyio byte streams over the private frame pipes.

Reading ``sys.stdin.buffer`` from a worker thread cannot be cancelled, and a buffered
file object blocks until its buffer fills, so the sidecar reads and writes the raw
file descriptors without blocking and waits for readiness on the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, Union

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.lowlevel import checkpoint

__all__ = ["FdReceiveStream", "FdSendStream"]

_IOV_MAX = 512


T = TypeVar("T")


class _FdStream:
    """A non-blocking pipe descriptor owned by the stream; readiness comes from the event loop."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._closed = False

    async def _retry(self, call: Callable[[int], T], wait: Callable[[int], Awaitable[None]]) -> T:
        """``call(fd)`` once the descriptor is ready; errors become anyio's stream errors."""
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                return call(self._fd)
            except BlockingIOError:
                await wait(self._fd)
            except OSError as exc:  # BrokenPipeError: the other process is gone
                raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._fd)
            os.close(self._fd)
        await checkpoint()


class FdReceiveStream(_FdStream, ByteReceiveStream):
    """Non-blocking reads from a pipe file descriptor."""

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await checkpoint()
        data = await self._retry(lambda fd: os.read(fd, max_bytes), anyio.wait_readable)
        if not data:
            raise anyio.EndOfStream
        return data

    async def receive_into(self, buffer: memoryview) -> int:
        """Read straight into ``buffer`` (no intermediate bytes object); return the count."""
        await checkpoint()
        count = await self._retry(lambda fd: os.readv(fd, [buffer]), anyio.wait_readable)
        if not count:
            raise anyio.EndOfStream
        return count


class FdSendStream(_FdStream, ByteSendStream):
    """Non-blocking writes to a pipe file descriptor."""

    async def send(self, item: bytes) -> None:
        await self.send_parts((item,))

    def try_send(self, item: Union[bytes, memoryview]) -> int:
        """Write what fits now, without waiting: the number of bytes written (0 if the pipe is full).

        Raises anyio's ``ClosedResourceError`` or ``BrokenResourceError`` as :meth:`send` does.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return os.write(self._fd, item)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def send_parts(self, parts: Sequence[Union[bytes, memoryview]]) -> None:
        """Write ``parts`` back to back with ``writev``: no joining copy."""
        await checkpoint()
        pending = [memoryview(part).cast("B") for part in parts if len(part)]
        while pending:
            written = await self._retry(lambda fd: os.writev(fd, pending[:_IOV_MAX]), anyio.wait_writable)
            while written:
                if written >= len(pending[0]):
                    written -= len(pending.pop(0))
                else:
                    pending[0] = pending[0][written:]
                    written = 0

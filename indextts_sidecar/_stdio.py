"""Non-blocking anyio byte streams over the private frame pipes.

Reading ``sys.stdin.buffer`` from a worker thread cannot be cancelled, and a buffered
file object blocks until its buffer fills, so the sidecar reads and writes the raw
file descriptors without blocking and waits for readiness on the event loop.
"""

from __future__ import annotations

import os

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.lowlevel import checkpoint

__all__ = ["FdReceiveStream", "FdSendStream"]


class FdReceiveStream(ByteReceiveStream):
    """Non-blocking reads from a pipe file descriptor, owned by this stream."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await checkpoint()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._fd)
            os.close(self._fd)
        await checkpoint()


class FdSendStream(ByteSendStream):
    """Non-blocking writes to a pipe file descriptor, owned by this stream."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._closed = False

    async def send(self, item: bytes) -> None:
        await checkpoint()
        view = memoryview(item)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            except OSError as exc:  # BrokenPipeError: the parent is gone
                raise anyio.BrokenResourceError from exc
            view = view[written:]

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._fd)
            os.close(self._fd)
        await checkpoint()

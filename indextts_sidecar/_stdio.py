"""Non-blocking anyio byte streams over the private frame pipes.

Reading ``sys.stdin.buffer`` from a worker thread cannot be cancelled, and a buffered
file object blocks until its buffer fills, so the sidecar reads and writes the raw
file descriptors without blocking and waits for readiness on the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Union

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.lowlevel import checkpoint

__all__ = ["FdReceiveStream", "FdSendStream"]

_IOV_MAX = 512


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

    async def receive_into(self, buffer: memoryview) -> int:
        """Read straight into ``buffer`` (no intermediate bytes object); return the count."""
        await checkpoint()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                count = os.readv(self._fd, [buffer])
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            if not count:
                raise anyio.EndOfStream
            return count

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

    async def send_parts(self, parts: Sequence[Union[bytes, memoryview]]) -> None:
        """Write ``parts`` back to back with ``writev``: no joining copy."""
        await checkpoint()
        pending = [memoryview(part).cast("B") for part in parts if len(part)]
        while pending:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                written = os.writev(self._fd, pending[:_IOV_MAX])
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
                continue
            except OSError as exc:  # BrokenPipeError: the parent is gone
                raise anyio.BrokenResourceError from exc
            while written:
                if written >= len(pending[0]):
                    written -= len(pending.pop(0))
                else:
                    pending[0] = pending[0][written:]
                    written = 0

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._fd)
            os.close(self._fd)
        await checkpoint()

"""Private, non-blocking frame pipes taken over from fds 0 and 1.

Reading ``sys.stdin.buffer`` from a worker thread cannot be cancelled, and a buffered
file object blocks until its buffer fills, so the sidecar reads and writes the raw
file descriptors without blocking and waits for readiness on the event loop.

Before anything else runs, the pipes the parent gave us move to private descriptors:
fd 0 then reads ``/dev/null`` and fd 1 points at stderr.  A library that prints,
from Python or from C, writes to stderr and cannot corrupt the frame stream, and a
grandchild process inherits neither pipe.
"""

from __future__ import annotations

import fcntl
import os
import sys

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.lowlevel import checkpoint

__all__ = ["FdReceiveStream", "FdSendStream", "take_over_stdio"]

_PIPE_SIZE = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def take_over_stdio() -> tuple[int, int]:
    """Move the frame pipes off fds 0 and 1; return the private (read, write) fds."""
    sys.stdout.flush()
    read_fd = os.dup(0)
    write_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    if sys.platform == "linux":
        try:  # bigger pipe: fewer wake-ups per MiB of audio; best effort
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass
    return read_fd, write_fd


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

"""Non-blocking anyio byte streams over the private frame pipes, and the features they declare.

Reading ``sys.stdin.buffer`` from a worker thread cannot be cancelled, and a buffered
file object blocks until its buffer fills, so the sidecar reads and writes the raw
file descriptors without blocking and waits for readiness on the event loop.

Beyond anyio's ``ByteReceiveStream`` and ``ByteSendStream`` these streams offer faster
ways in and out.  Each is a :class:`typing.Protocol` below (:class:`NonBlockingSend`,
:class:`VectoredSend`, :class:`ReceiveInto`, :class:`ReadinessCallback`), checked once
where a stream is wrapped (``isinstance``: the :class:`~.framing.FrameReader`,
:class:`~.framing.FrameWriter` and the sidecar's outbox), so that any stream (a socket, a
TLS stream, a test's) works with anyio's methods alone and the code that uses a feature
is typed against it.
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar, Union, runtime_checkable

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.lowlevel import cancel_shielded_checkpoint, checkpoint, checkpoint_if_cancelled

__all__ = [
    "FdReceiveStream",
    "FdSendStream",
    "NonBlockingSend",
    "ReadinessCallback",
    "ReceiveInto",
    "VectoredSend",
    "loop_clock",
]

_IOV_MAX = 512


T = TypeVar("T")
_Parts = Sequence[Union[bytes, memoryview]]


@runtime_checkable
class NonBlockingSend(Protocol):
    """A send stream that writes what fits now, from any thread, without waiting (a pipe)."""

    def try_send(self, item: Union[bytes, memoryview]) -> int:
        """Bytes of ``item`` written now (0: full); raises anyio's Closed/BrokenResourceError."""
        ...

    def try_send_parts(self, parts: _Parts) -> int:
        """Bytes of ``parts`` written now, with one gathered write; raises as :meth:`try_send`."""
        ...


@runtime_checkable
class VectoredSend(Protocol):
    """A send stream that writes several buffers back to back without joining them first."""

    async def send_parts(self, parts: _Parts) -> None: ...


@runtime_checkable
class ReceiveInto(Protocol):
    """A receive stream that reads straight into a caller's buffer."""

    async def receive_into(self, buffer: memoryview) -> int:
        """Bytes read into ``buffer``; raises ``anyio.EndOfStream`` at the end."""
        ...


@runtime_checkable
class ReadinessCallback(Protocol):
    """A receive stream over a descriptor, calling back on each readiness (:meth:`FdReceiveStream.when_readable`)."""

    def fileno(self) -> int: ...

    async def when_readable(self, callback: Callable[[], Union[float, None]], deadline: float = math.inf) -> None: ...


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock (``anyio.current_time``'s), as a function.

    Call this in a task; the function it returns also works where anyio cannot tell
    which event loop runs (an asyncio readiness callback, outside any task).
    """
    try:
        return asyncio.get_running_loop().time  # only under asyncio
    except RuntimeError:
        pass
    try:  # under trio: its clock's own method, what trio.current_time() reads, without anyio's lookup
        import trio

        clock: Callable[[], float] = trio.lowlevel.current_clock().current_time
        return clock
    except (ImportError, RuntimeError):
        return anyio.current_time


class _FdStream:
    """A non-blocking pipe descriptor owned by the stream; readiness comes from the event loop."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._closed = False
        self._watch: Union[asyncio.Future[None], None] = None

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
            watch, self._watch = self._watch, None
            if watch is not None and not watch.done():
                # A when_readable() in progress: unregister before the number can be reused.
                watch.get_loop().remove_reader(self._fd)
                watch.set_exception(anyio.ClosedResourceError())
            anyio.notify_closing(self._fd)
            os.close(self._fd)
        await checkpoint()


def _pollable(fd: int) -> bool:
    """Whether readiness can be waited for on ``fd``: a pipe, a socket or a terminal.

    A regular file or ``/dev/null`` cannot be registered with epoll (EPERM), and needs not
    be: a read from it never blocks.
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return True  # let the read report it
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


class FdReceiveStream(_FdStream, ByteReceiveStream):
    """Non-blocking reads from a pipe file descriptor (or a regular file, ``/dev/null``).

    Each receive is a checkpoint, as anyio's streams are, but reads before it waits:
    when data has to be waited for, the wait is the only turn of the event loop; when
    it is there already, the read is followed by a shielded checkpoint (cancellation
    never loses bytes that were read).
    """

    def __init__(self, fd: int) -> None:
        super().__init__(fd)
        #: False for a descriptor whose reads never wait (a regular file, ``/dev/null``): its
        #: end is the end of what was written to it, not a parent that went away.
        self.pollable = _pollable(fd)

    async def _read(self, call: Callable[[int], T]) -> T:
        await checkpoint_if_cancelled()
        waited = False
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                result = call(self._fd)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                waited = True
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            if not waited:
                await cancel_shielded_checkpoint()
            return result

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self._read(lambda fd: os.read(fd, max_bytes))
        if not data:
            raise anyio.EndOfStream
        return data

    async def receive_into(self, buffer: memoryview) -> int:
        """Read straight into ``buffer`` (no intermediate bytes object); return the count."""
        count = await self._read(lambda fd: os.readv(fd, [buffer]))
        if not count:
            raise anyio.EndOfStream
        return count

    def fileno(self) -> int:
        return self._fd

    async def when_readable(self, callback: Callable[[], Union[float, None]], deadline: float = math.inf) -> None:
        """Call ``callback`` each time the descriptor is readable, until it returns None.

        ``callback`` reads for itself (without blocking) and returns the anyio clock time by
        which the descriptor must next be readable (``math.inf``: no limit), or None to stop;
        past that time this raises ``TimeoutError``.  What ``callback`` raises propagates.
        On asyncio the descriptor stays registered with the event loop throughout and
        ``callback`` runs from the loop's own readiness callback: no task switch and no
        re-registration per read.  Elsewhere it is a loop of ``wait_readable``.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        if not self.pollable:
            # Always readable: read on, a turn of the event loop between two bursts.
            while callback() is not None:
                await checkpoint()
                if self._closed:
                    raise anyio.ClosedResourceError
            return
        try:
            loop = asyncio.get_running_loop()  # only under asyncio
        except RuntimeError:
            pass
        else:
            await self._when_readable_asyncio(loop, callback, deadline)
            return
        try:  # under trio: its own wait, without anyio's lookup of the backend at every wake-up
            import trio

            trio.lowlevel.current_task()
        except (ImportError, RuntimeError):
            await self._when_readable_waiting(anyio.wait_readable, callback, deadline)
            return
        try:
            await self._when_readable_waiting(trio.lowlevel.wait_readable, callback, deadline)
        except trio.ClosedResourceError:  # closed while waiting: anyio's error, as anyio's wait raises
            raise anyio.ClosedResourceError from None
        except trio.BusyResourceError:
            raise anyio.BusyResourceError("reading from") from None

    async def _when_readable_waiting(
        self,
        wait_readable: Callable[[int], Awaitable[None]],
        callback: Callable[[], Union[float, None]],
        deadline: float,
    ) -> None:
        limit: Union[float, None] = deadline
        while limit is not None:
            if limit == math.inf:
                await wait_readable(self._fd)
            else:
                with anyio.move_on_at(limit) as scope:
                    await wait_readable(self._fd)
                if scope.cancelled_caught:
                    raise TimeoutError
            limit = callback()

    async def _when_readable_asyncio(
        self, loop: asyncio.AbstractEventLoop, callback: Callable[[], Union[float, None]], deadline: float
    ) -> None:
        done: asyncio.Future[None] = loop.create_future()
        timer: Union[asyncio.TimerHandle, None] = None
        armed = math.inf

        def arm(limit: float) -> None:
            nonlocal timer, armed
            if limit == armed:
                return
            if timer is not None:
                timer.cancel()
                timer = None
            armed = limit
            if limit != math.inf:
                timer = loop.call_at(limit, expired)

        def expired() -> None:
            if not done.done():
                done.set_exception(TimeoutError())

        def readable() -> None:
            if done.done():
                return
            try:
                limit = callback()
            except Exception as exc:
                done.set_exception(exc)
                return
            if limit is None:
                done.set_result(None)
            else:
                arm(limit)

        arm(deadline)
        loop.add_reader(self._fd, readable)
        self._watch = done
        try:
            await done
        finally:
            self._watch = None
            loop.remove_reader(self._fd)
            if timer is not None:
                timer.cancel()


class FdSendStream(_FdStream, ByteSendStream):
    """Non-blocking writes to a pipe file descriptor."""

    async def send(self, item: bytes) -> None:
        await self.send_parts((item,))

    def try_send(self, item: Union[bytes, memoryview]) -> int:
        """Write what fits now, without waiting: the number of bytes written (0 if the pipe is full).

        Raises anyio's ``ClosedResourceError`` or ``BrokenResourceError`` as :meth:`send` does.
        """
        # try_send_parts((item,)) with one write, one call less: a client writes each request this way.
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return os.write(self._fd, item)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    def try_send_parts(self, parts: Sequence[Union[bytes, memoryview]]) -> int:
        """Write what fits of ``parts`` now, with one ``writev``, without waiting: the bytes written.

        Raises anyio's ``ClosedResourceError`` or ``BrokenResourceError`` as :meth:`send` does.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return os.writev(self._fd, parts[:_IOV_MAX])
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

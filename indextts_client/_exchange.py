"""One request id on the wire, and what the request layer needs of a connection.

An :class:`Exchange` is the inbox the connection's reader fills for one request id (frames,
failure, liveness facts); the request's own task drains it (:mod:`._request`).
:class:`Channel` is the connection as the request layer sees it, so that module needs
no import of :mod:`._connection`, which builds on it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Protocol, Union

import anyio

from indextts_sidecar import protocol

from ._audio import AudioAssembler
from ._exceptions import ProtocolError, SidecarError

__all__ = ["Channel", "Exchange"]


class Exchange:
    """One request id on the wire: its inbox of frames and its liveness facts."""

    __slots__ = (
        "abandoned",
        "absorbed",
        "buffered",
        "cancel_sent",
        "data",
        "deadline",
        "error",
        "id",
        "items",
        "last_frame",
        "new_event",
        "progress_wanted",
        "sent",
        "sent_at",
        "sink",
        "sink_error",
        "terminated",
        "wakeup",
    )

    def __init__(self, request_id: int, now: float, new_event: Callable[[], anyio.Event]) -> None:
        self.id = request_id
        self.new_event = new_event
        self.items: deque[protocol.Reply] = deque()
        #: Set when a frame or a failure arrives, if the request's task waits (see :meth:`wait`).
        self.wakeup: Union[anyio.Event, None] = None
        self.error: Union[SidecarError, None] = None
        self.abandoned = False
        #: Bytes of audio in ``items``, not yet consumed.
        self.buffered = 0
        self.sent = False
        self.sent_at = now
        #: Whether progress frames go to the request's task (else they only count as activity).
        self.progress_wanted = True
        #: Frames the reader took care of without the request's task (audio into ``sink``, progress).
        self.absorbed = 0
        #: Arrival time of the last frame for this id (None until the first one).
        self.last_frame: Union[float, None] = None
        self.terminated = False
        self.cancel_sent: Union[anyio.Event, None] = None
        #: While the request's task waits: when it must wake at the latest (see Connection._wait_until).
        self.deadline = math.inf
        #: The encoded frame, until it is sent.
        self.data = b""
        #: Where the reader puts this request's audio as it arrives (synthesize()), if anywhere.
        self.sink: Union[AudioAssembler, None] = None
        #: A bad audio frame the reader found for the sink; raised in the request's task.
        self.sink_error: Union[ProtocolError, None] = None

    def deliver(self, reply: protocol.Reply, now: float, terminal: bool) -> None:
        self.last_frame = now
        if terminal:
            self.terminated = True
        if not self.abandoned:
            self.items.append(reply)
            self.wake()

    def wake(self) -> None:
        wakeup, self.wakeup = self.wakeup, None
        if wakeup is not None:
            wakeup.set()

    def fail(self, error: SidecarError) -> None:
        self.terminated = True
        self.error = error
        self.wake()

    async def wait(self) -> None:
        """Until a frame or a failure is there to read."""
        if self.items or self.error is not None:
            return
        if self.wakeup is None:
            self.wakeup = self.new_event()
        await self.wakeup.wait()


class Channel(Protocol):
    """What a request needs of the connection it is sent on (:class:`~._connection.Connection`)."""

    #: anyio clock time of the last progress or audio frame of any request.
    last_activity: float
    #: The event loop's clock (anyio's time), cheaper than ``anyio.current_time()``.
    _clock: Callable[[], float]
    #: Whether this side asked the sidecar to stop.
    _stop_asked: bool
    _redact: Callable[[str], str]

    def _register(self, build: Callable[[int], protocol.Request]) -> Exchange: ...

    async def _send_exchange(self, exchange: Exchange) -> None: ...

    def _forget(self, exchange: Exchange) -> Union[anyio.Event, None]: ...

    def _drop(self, exchange: Exchange) -> None: ...

    def _room_event(self) -> Union[anyio.Event, None]: ...

    async def _wait_until(self, exchange: Exchange, deadline: float) -> None: ...

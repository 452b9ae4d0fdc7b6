"""One request id on the wire, and the seam between requests and the connection.

An :class:`Exchange` is the inbox the connection's reader fills for one request id (frames,
failure, liveness facts); the request's own task drains it (:mod:`._request_run`).  The
exchange keeps its own audio accounting and, for ``synthesize()``, its own assembler.
:class:`Channel` is the connection as the request layer sees it: a few public methods, so
that module needs no import of :mod:`._connection`, which builds on it.
:func:`encode_request` is the encoding and its checks, without any connection.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, Union

import anyio
import msgspec

from indextts_sidecar import protocol

from .._audio import AudioAssembler
from .._exceptions import InvalidRequestError, ProtocolError, SidecarError

__all__ = ["TERMINAL_KINDS", "Channel", "Exchange", "ExchangeState", "Wakeup", "encode_request", "wakeup_class"]

#: Option values that cannot nest: a request made of them needs no depth check.
_SCALARS = (str, int, float, bool, bytes, type(None))
_NO_SAMPLES = memoryview(b"")


class ExchangeState(enum.Enum):
    """Where one request id is in its life on the wire; the only state an exchange has."""

    #: It has its id and its encoded frame; no byte of it is written yet.
    REGISTERED = "registered"
    #: Written; its terminal frame has not arrived.
    SENT = "sent"
    #: Its terminal frame arrived, or the connection failed it after it was sent; frames may remain to read.
    ENDED = "ended"
    #: The caller gave up on it: its frames are dropped (a ``cancel`` may be on its way).
    ABANDONED = "abandoned"


#: The kinds of reply that end the request whose id they carry: :func:`protocol.is_terminal` by
#: type alone, for the frames with an id (the reader's test on every frame).
TERMINAL_KINDS = frozenset({protocol.Done, protocol.Ok, protocol.Pong, protocol.Error})

REGISTERED, SENT, ENDED, ABANDONED = (
    ExchangeState.REGISTERED,
    ExchangeState.SENT,
    ExchangeState.ENDED,
    ExchangeState.ABANDONED,
)


class Wakeup(Protocol):
    """What an exchange's one waiting task sleeps on until :meth:`set`: an :class:`anyio.Event` will do."""

    def set(self) -> None: ...

    def wait(self) -> Awaitable[Any]: ...


class _LoopWakeup(asyncio.Future[None]):
    """asyncio: one future the waiting task awaits itself (no Event, no waiter list, no wrapper).

    Made in the waiting task (the running loop's future).  A cancelled wait cancels it:
    :meth:`Exchange.wait` makes a new one for each wait, so none is waited on twice.
    """

    __slots__ = ()

    def set(self) -> None:
        if not self.done():
            self.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        return self


class _TaskWakeup:
    """trio: the waiting task parks itself and :meth:`set` reschedules it (no Event, no parking lot)."""

    __slots__ = ("_is_set", "_task")

    #: ``trio.lowlevel``, put here by :func:`wakeup_class` (trio is imported only where it runs).
    lowlevel: Any = None

    def __init__(self) -> None:
        self._task: Any = None
        self._is_set = False

    def set(self) -> None:
        self._is_set = True
        task, self._task = self._task, None
        if task is not None:
            self.lowlevel.reschedule(task)

    async def wait(self) -> None:
        lowlevel = self.lowlevel
        if self._is_set:
            await lowlevel.checkpoint()
            return
        self._task = lowlevel.current_task()
        await lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> Any:
        self._task = None  # cancelled: nothing to reschedule any more
        return self.lowlevel.Abort.SUCCEEDED


def wakeup_class() -> Callable[[], Wakeup]:
    """The cheapest :class:`Wakeup` of the running backend (call it in a task); anyio's Event elsewhere."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return _LoopWakeup
    try:
        import trio

        trio.lowlevel.current_task()
    except (ImportError, RuntimeError):
        return type(anyio.Event())
    _TaskWakeup.lowlevel = trio.lowlevel
    return _TaskWakeup


class Exchange:
    """One request id on the wire: its inbox of frames, its audio and its liveness facts."""

    __slots__ = (
        "assembler",
        "assembly_error",
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
        "sent_at",
        "state",
        "taken_by_reader",
        "wakeup",
    )

    def __init__(
        self,
        request_id: int,
        now: float,
        new_event: Callable[[], Wakeup],
        state: ExchangeState = REGISTERED,
    ) -> None:
        self.id = request_id
        #: Makes what :meth:`wait` sleeps on (:func:`wakeup_class`, or :class:`anyio.Event`).
        self.new_event = new_event
        self.state = state
        self.items: deque[protocol.Reply] = deque()
        #: Set when a frame or a failure arrives, if the request's task waits (see :meth:`wait`).
        self.wakeup: Union[Wakeup, None] = None
        #: Why the request failed (raised in its task once the frames before it are read).
        self.error: Union[SidecarError, None] = None
        #: Bytes of audio in ``items``, not yet taken by :meth:`next_item`.
        self.buffered = 0
        self.sent_at = now
        #: Whether progress frames go to the request's task (else they only count as activity).
        self.progress_wanted = True
        #: Frames the reader took care of without the request's task (audio assembled, unwanted progress).
        self.taken_by_reader = 0
        #: Arrival time of the last frame for this id (None until the first one).
        self.last_frame: Union[float, None] = None
        #: Set once the ``cancel`` sent for this request after it was abandoned is written.
        self.cancel_sent: Union[anyio.Event, None] = None
        #: While the request's task waits: when it must wake at the latest (see DeadlineAlarm).
        self.deadline = math.inf
        #: The encoded frame, until it is sent.
        self.data = b""
        #: synthesize(): the reader puts this request's audio here as it arrives, not in ``items``.
        self.assembler: Union[AudioAssembler, None] = None
        #: A bad audio frame the reader found while assembling (also in ``error``).
        self.assembly_error: Union[ProtocolError, None] = None

    def assemble_audio(self, text: str = "") -> AudioAssembler:
        """Let the reader assemble this request's audio as frames arrive (synthesize()).

        The audio then never waits in ``items`` and the request's task sleeps until the end.
        ``text`` is the request's, which the words and segments it announces point into.
        """
        self.assembler = AudioAssembler(self.id, keep=True, text=text)
        return self.assembler

    def mark_sent(self) -> None:
        """Its last byte is written (its terminal frame may have arrived already)."""
        if self.state is REGISTERED:
            self.state = SENT

    def receive(self, reply: protocol.Reply, now: float, terminal: bool, shares: Callable[[memoryview], bool]) -> None:
        """A frame for this id, from the reader; ``shares(pcm)``: whether ``pcm`` is read over later."""
        self.last_frame = now
        state = self.state
        if terminal and state is not ABANDONED:
            self.state = ENDED
        if state is ABANDONED or self.error is not None:
            return
        if type(reply) is protocol.Audio:
            if self.assembler is not None:
                self._assemble(reply, shares(reply.pcm))
                return
            if shares(reply.pcm):  # the request keeps a copy
                reply.pcm = memoryview(bytes(reply.pcm))
            self.buffered += len(reply.pcm)
        elif type(reply) is protocol.Progress:
            if self.assembler is not None:  # a segment starts at the audio assembled so far
                self.assembler.progress(reply.stage, reply.message)
            if not self.progress_wanted:
                self.taken_by_reader += 1  # nobody listens: it only counts as activity
                return
        self.items.append(reply)
        self.wake()

    def _assemble(self, reply: protocol.Audio, transient: bool) -> None:
        assembler = self.assembler
        assert assembler is not None
        try:
            assembler.absorb(reply.seq, reply.sample_rate, reply.pcm, transient=transient, words=reply.words)
        except ProtocolError as exc:
            # Raised in the request's task after the frames before it; later frames are dropped.
            self.assembly_error = self.error = exc
            self.wake()
            return
        reply.pcm = _NO_SAMPLES
        self.taken_by_reader += 1

    def next_item(self) -> Union[protocol.Reply, None]:
        """The oldest frame not yet read (its audio no longer counts as buffered), or None."""
        if not self.items:
            return None
        item = self.items.popleft()
        if type(item) is protocol.Audio:
            assert isinstance(item, protocol.Audio)
            self.buffered -= len(item.pcm)
        return item

    def abandon(self) -> ExchangeState:
        """Its caller gave up: drop what waits and what comes; returns the state it was in."""
        was = self.state
        self.state = ABANDONED
        self.items.clear()
        self.buffered = 0
        return was

    def wake(self) -> None:
        wakeup, self.wakeup = self.wakeup, None
        if wakeup is not None:
            wakeup.set()

    def fail(self, error: SidecarError) -> None:
        """The connection failed it (ended, or announced it will read no more)."""
        if self.state is SENT:
            self.state = ENDED
        self.error = error
        self.wake()

    async def wait(self) -> None:
        """Until a frame or a failure is there to read (one task waits on an exchange)."""
        if self.items or self.error is not None:
            return
        # A new one each wait: a wait that was cancelled leaves nothing behind that the next one reuses.
        self.wakeup = wakeup = self.new_event()
        await wakeup.wait()


def encode_request(message: protocol.Request, max_frame_size: int) -> bytes:
    """The frame of ``message``, or an :class:`InvalidRequestError` saying why no sidecar would take it.

    ``max_frame_size`` is the sidecar's (from its ``ready``).
    """
    request_id = message.id
    try:
        data = protocol.frame(message)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidRequestError(
            f"the request cannot be encoded: {exc}", code="invalid_option", request_id=request_id
        ) from None
    except RecursionError:
        raise InvalidRequestError(
            f"the request is nested too deep to encode (at most {protocol.MAX_DEPTH} levels)",
            code="invalid_option",
            request_id=request_id,
            detail={"field": "$"},
        ) from None
    if type(message) is protocol.Synthesize:
        for value in message.options.values():
            if isinstance(value, _SCALARS):
                continue
            # Only engine options can nest without limit; the sidecar may refuse deeper ones.
            depth = protocol.peek(data[protocol.HEADER :]).depth
            if depth > protocol.MAX_DEPTH:
                raise InvalidRequestError(
                    f"the request is nested {depth} levels deep, more than the {protocol.MAX_DEPTH} "
                    "a sidecar must accept",
                    code="invalid_option",
                    request_id=request_id,
                    detail={"field": "$", "depth": depth},
                )
            break
    size = len(data) - protocol.HEADER
    if size > max_frame_size:
        raise InvalidRequestError(
            f"the request takes {size} bytes, more than the sidecar's max_frame_size of {max_frame_size}",
            code="invalid_input",
            request_id=request_id,
        )
    return data


class Channel(Protocol):
    """What a request needs of the connection it is sent on (:class:`~._connection.Connection`)."""

    #: anyio clock time of the last progress or audio frame of any request.
    last_activity: float
    #: The sidecar's ``ready`` (its capabilities: ``word_timings``...), once it came.
    ready: Union[protocol.Ready, None]

    @property
    def clock(self) -> Callable[[], float]:
        """The event loop's clock (anyio's time), cheaper than ``anyio.current_time()``."""
        ...

    @property
    def asked_to_stop(self) -> bool:
        """Whether this side asked the sidecar to stop (``shutdown``, ``aclose``)."""
        ...

    def redact(self, text: str) -> str:
        """``text`` with the secrets this connection knows of blanked out."""
        ...

    def open_exchange(self, build: Callable[[int], protocol.Request]) -> Exchange:
        """Give the request built by ``build(id)`` an id and its frame; nothing is sent yet."""
        ...

    async def send(self, exchange: Exchange) -> None:
        """Write the exchange's frame; raises the connection's error if it cannot be sent."""
        ...

    def abandon(self, exchange: Exchange, *, cancel: bool) -> Union[anyio.Event, None]:
        """The caller gave up; ``cancel``: cancel it on the sidecar (returns the event of that write)."""
        ...

    def wait(self, exchange: Exchange, deadline: float) -> Awaitable[None]:
        """Until a frame or a failure arrives for ``exchange``, or ``deadline`` passes."""
        ...

    def room(self) -> Union[anyio.Event, None]:
        """An event set when the next request of this connection ends; None when none is in flight."""
        ...

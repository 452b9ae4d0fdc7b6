"""One alarm per connection that wakes the requests whose deadline passed.

A request waiting on its exchange with a deadline costs no cancel scope and no timer of its
own: :meth:`DeadlineAlarm.wait` files it, and the alarm task (:meth:`DeadlineAlarm.run`)
sleeps until the nearest deadline it knows of and wakes those that are due.  The woken
request looks at the clock itself and raises its own timeout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, Union

import anyio

__all__ = ["DeadlineAlarm", "Sleeper"]


class Sleeper(Protocol):
    """What the alarm needs of a waiting request (an :class:`~._exchange.Exchange`)."""

    #: When it must wake at the latest; the alarm writes it.
    deadline: float

    def wake(self) -> None: ...

    async def wait(self) -> None: ...


class DeadlineAlarm:
    """Wakes each waiting :class:`Sleeper` once its deadline has passed.

    Deadlines only move later while a request waits (a frame pushes its idle deadline on),
    so the alarm may wake early and find nothing due: it then sleeps again.
    """

    def __init__(self, new_event: Callable[[], anyio.Event] = anyio.Event) -> None:
        #: Makes events; the connection swaps in the running backend's own class.
        self.new_event = new_event
        self._waiting: set[Sleeper] = set()
        #: When the alarm task wakes next (the nearest deadline it knows of).
        self._wakes_at = math.inf
        #: Set to wake the alarm task for an earlier deadline; None while no task runs.
        self._earlier: Union[anyio.Event, None] = None

    @property
    def running(self) -> bool:
        """Whether the alarm task runs (else each wait keeps its own deadline)."""
        return self._earlier is not None

    @property
    def waiting(self) -> int:
        """How many requests wait with a deadline now."""
        return len(self._waiting)

    async def wait(self, sleeper: Sleeper, deadline: float) -> None:
        """Until ``sleeper`` is woken (a frame, a failure) or ``deadline`` passes; returns either way."""
        if self._earlier is None:  # no alarm task (not started, or ended)
            with anyio.move_on_at(deadline):
                await sleeper.wait()
            return
        sleeper.deadline = deadline
        if deadline < self._wakes_at:
            self._wakes_at = deadline
            self._earlier.set()
        self._waiting.add(sleeper)
        try:
            await sleeper.wait()
        finally:
            self._waiting.discard(sleeper)

    async def run(self) -> None:
        """The alarm task: until cancelled; on its way out it wakes every waiting request."""
        try:
            while True:
                self._earlier = earlier = self.new_event()
                with anyio.move_on_at(self._wakes_at):
                    await earlier.wait()
                    continue  # an earlier deadline arrived: sleep until that one
                now = anyio.current_time()
                nearest = math.inf
                for sleeper in self._waiting:
                    if sleeper.deadline <= now:
                        sleeper.wake()
                    elif sleeper.deadline < nearest:
                        nearest = sleeper.deadline
                self._wakes_at = nearest
        finally:
            self._earlier = None
            for sleeper in self._waiting:  # their tasks wait on with a deadline of their own
                sleeper.wake()

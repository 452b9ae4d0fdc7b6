"""The restart budget: how often a client may start its sidecar again, and how long it waits first.

Pure bookkeeping, no I/O and no clock of its own: every method that needs the time takes
``now`` (``anyio.current_time()`` in the supervisor, a plain number in the tests).  The
supervisor asks it, before each automatic restart, whether the budget is spent and how
long to wait; it records the restart; an explicit restart or a successful revive starts
the budget afresh.
"""

from __future__ import annotations

from collections import deque
from typing import Union

from .._exceptions import RestartLimitError, SidecarError

__all__ = ["RestartBudget", "summary"]


def summary(exc: BaseException) -> str:
    """One line about ``exc`` (without the stderr tail), for logs and the dead client's message."""
    text = exc.message if isinstance(exc, SidecarError) else str(exc)
    return f"{type(exc).__name__}: {text}"


class RestartBudget:
    """At most ``max_restarts`` automatic restarts within any ``window`` seconds.

    The n-th restart among those still in the window waits ``backoff * 2**n`` seconds,
    at most ``max_backoff``, counted from when the last session ended.  Once the budget
    is spent the client is *dead*: :attr:`dead` holds the :class:`RestartLimitError`
    that every call raises, until :meth:`reset`.
    """

    def __init__(self, *, max_restarts: int, window: float, backoff: float, max_backoff: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.max_backoff = max_backoff
        #: Start times of the restarts within the window, oldest first.
        self._times: deque[float] = deque()
        #: The error every call raises once the budget is spent, else None.
        self.dead: Union[RestartLimitError, None] = None
        #: When ``dead`` was last set, else None.
        self.dead_at: Union[float, None] = None

    def recent(self, now: float) -> int:
        """How many restarts are still within the window at ``now`` (older ones are forgotten)."""
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()
        return len(self._times)

    def spent(self, now: float) -> bool:
        """Whether one more restart at ``now`` would exceed the budget."""
        return self.recent(now) >= self.max_restarts

    def delay(self, now: float, ended_at: float) -> float:
        """Seconds from ``now`` until the next restart may begin (0 when its backoff has passed)."""
        backoff = min(self.max_backoff, self.backoff * 2.0 ** self.recent(now))
        return max(0.0, ended_at + backoff - now)

    def record(self, now: float) -> None:
        """A restart begins at ``now``."""
        self._times.append(now)

    def give_up(self, reason: BaseException, now: float) -> RestartLimitError:
        """The budget is spent: the client is dead from ``now``, ``reason`` being the last failure."""
        self.dead = RestartLimitError(
            f"the sidecar failed {len(self._times) + 1} times within {self.window:g} s "
            f"(max_restarts={self.max_restarts}); the client gave up. Last failure: {summary(reason)}",
            max_restarts=self.max_restarts,
            restart_window=self.window,
            last_error=reason,
        )
        self.dead_at = now
        return self.dead

    def revive_failed(self, reason: BaseException, now: float) -> RestartLimitError:
        """A dead client's revive failed with ``reason``: it stays dead, from ``now``."""
        self.dead = RestartLimitError(
            f"the sidecar could not be revived after its restart limit: {summary(reason)}",
            max_restarts=self.max_restarts,
            restart_window=self.window,
            last_error=reason,
        )
        self.dead_at = now
        return self.dead

    def reset(self) -> None:
        """Start afresh (an explicit restart, a successful revive): not dead, no recent restarts."""
        self.dead = self.dead_at = None
        self._times.clear()

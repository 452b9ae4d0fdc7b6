"""A pool's members and the routing decision: which member takes the next request.

:class:`Router` decides under one lock and does no I/O under it (httpcore's pool does the
same): :meth:`Router.acquire` waits for room and counts the request on its member,
:meth:`Router.release` uncounts it and remembers which member a voice was served on.
:class:`~indextts_client.Pool` and its streams (``_stream.py``) hold a router; the
healer (in ``_pool.py``) reads the members and wakes waiters once a member revived.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

import anyio

from .._client import Client
from .._exceptions import BusyError, ClosedError, RestartLimitError

__all__ = ["Member", "Router", "device_env"]


@dataclass
class Member:
    """One sidecar of a pool, with what routing and healing count for it."""

    index: int
    device: Union[str, None]
    client: Client
    outstanding: int = 0
    served: int = 0
    url: Union[str, None] = None
    #: Healing: when the next revival is due, failed revivals in a row, one under way.
    revive_at: Union[float, None] = None
    revive_failures: int = 0
    reviving: bool = False

    @property
    def usable(self) -> bool:
        return not (self.client.closed or self.client.dead)


def device_env(device: str) -> dict[str, str]:
    """Pin a member to one GPU: ``cuda:1`` / ``1`` -> ``CUDA_VISIBLE_DEVICES=1``; ``cpu`` -> none."""
    name = device.strip()
    if name == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    index = name.split(":", 1)[1] if name.startswith("cuda:") else name
    if not index.isdigit():
        raise ValueError(f"device {device!r}: give cuda:N, N or cpu")
    return {"CUDA_VISIBLE_DEVICES": index}


@dataclass
class Router:
    """Routing state and its one lock: members, voice affinity, the round-robin turn, limits."""

    members: list[Member]
    max_outstanding: int
    #: Seconds a request waits for room before ``BusyError``; None: no limit.
    pool_timeout: Union[float, None]
    affinity_slack: int
    #: Called with a member a request just left (it may have died meanwhile: wake the healer).
    on_release: Callable[[Member], None] = lambda member: None
    #: Appended to the error when every member is dead (when the next revival is due).
    revival_note: Callable[[], str] = lambda: ""
    started: bool = False
    closed: bool = False
    affinity: dict[str, int] = field(default_factory=dict)
    turn: itertools.count[int] = field(default_factory=itertools.count)
    room: anyio.Condition = field(default_factory=anyio.Condition)

    def pick(self, voice: Union[str, None], exclude: set[int]) -> Union[Member, None]:
        """The member for the next request, or None when every usable one is full.  Under the lock."""
        usable = [m for m in self.members if m.usable and m.index not in exclude]
        if not usable and exclude:
            usable = [m for m in self.members if m.usable]  # better the same member than none
        room = [m for m in usable if m.outstanding < self.max_outstanding]
        if not room:
            return None
        least = min(m.outstanding for m in room)
        if voice is not None:
            warm = self.affinity.get(voice)
            for member in room:
                if member.index == warm and member.outstanding <= least + self.affinity_slack:
                    return member
        # Round robin among the least busy, so equal members share the load.
        candidates = [m for m in room if m.outstanding == least]
        return candidates[next(self.turn) % len(candidates)]

    async def acquire(self, voice: Union[str, None], exclude: set[int]) -> Member:
        """A member with room for one more request (counted on it), waiting up to ``pool_timeout``."""
        deadline = math.inf if self.pool_timeout is None else anyio.current_time() + self.pool_timeout
        async with self.room:
            while True:
                if self.closed:
                    raise ClosedError("the pool is closed")
                if not self.started:
                    raise RuntimeError("the pool is not started: use 'async with Pool(...)' or 'await pool.start()'")
                if not any(m.usable for m in self.members):
                    raise RestartLimitError(f"every member of the pool is dead or closed{self.revival_note()}")
                member = self.pick(voice, exclude)
                if member is not None:
                    member.outstanding += 1
                    return member
                with anyio.move_on_after(deadline - anyio.current_time()):
                    await self.room.wait()
                    continue
                raise BusyError(
                    f"every member of the pool has {self.max_outstanding} requests in flight; "
                    f"no room within pool_timeout={self.pool_timeout} s",
                    code="busy",
                    retryable=True,
                )

    async def release(self, member: Member, voice: Union[str, None], served: bool) -> None:
        """Uncount a request on ``member`` (shielded); a served voice stays with its member."""
        with anyio.CancelScope(shield=True):
            async with self.room:
                member.outstanding -= 1
                self.on_release(member)
                if served:
                    member.served += 1
                    if voice is not None:
                        self.affinity[voice] = member.index
                self.room.notify_all()

    async def wake_all(self) -> None:
        """Wake every waiting request to look again (a member revived, or the pool closed)."""
        async with self.room:
            self.room.notify_all()

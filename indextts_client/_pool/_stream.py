"""A streamed request on a pool: the member routing picks, and another if it fails before any audio."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Union

import anyio

from .._audio import AudioChunk, WordTiming
from .._exceptions import BusyError, CrashedError, RestartLimitError, StartError
from .._wire._request import Synthesis
from ._routing import Member, Router

__all__ = ["RETRYABLE", "PoolStream"]

#: Failures after which a request that delivered nothing may run on another member.
#: StartError: a member could not (re)start, e.g. a remote sidecar that refuses connections.
RETRYABLE = (CrashedError, BusyError, RestartLimitError, StartError)


class PoolStream:
    """A streamed request on a pool member; moves to another member if its own fails before any audio."""

    def __init__(self, router: Router, retries: int, text: str, kwargs: dict[str, Any]) -> None:
        self._router = router
        self._retries = retries
        self._text = text
        self._kwargs = kwargs
        self._voice: Union[str, None] = kwargs.get("voice")
        self._member: Union[Member, None] = None
        self._synthesis: Union[Synthesis, None] = None
        self._tried: set[int] = set()
        self._attempt = 0
        self._delivered = False
        self._done = False
        #: The sidecar's seconds per phase (``queued``, ``first_audio``...), once it finished.
        self.timings: dict[str, float] = {}
        #: The engine's facts about it (``voice_cache``...), once it finished.
        self.facts: dict[str, Any] = {}
        #: Every word it spoke (as :attr:`Audio.words`), once it finished.
        self.words: tuple[WordTiming, ...] = ()
        #: The index of the member serving it (the last one tried), None before one is chosen.
        self.member_index: Union[int, None] = None

    async def __aenter__(self) -> PoolStream:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        await self._close(served=self._done)

    def __aiter__(self) -> PoolStream:
        if self._synthesis is None and not self._done:
            # Not entered: iterating would end at once, silently, with no audio.
            raise RuntimeError("iterate inside 'async with pool.stream(...) as chunks:'")
        return self

    async def __anext__(self) -> AudioChunk:
        while True:
            synthesis = self._synthesis
            if synthesis is None:
                raise StopAsyncIteration
            try:
                chunk = await synthesis.__anext__()
            except StopAsyncIteration:
                self._done = True
                raise
            except RETRYABLE:
                if self._delivered or self._attempt >= self._retries:
                    raise
                member = self._member
                assert member is not None
                self._tried.add(member.index)
                self._attempt += 1
                await self._close(served=False)
                await self._open()
                continue
            self._delivered = True
            return chunk

    async def _open(self) -> None:
        member = await self._router.acquire(self._voice, self._tried)
        self._member = member
        self.member_index = member.index
        try:
            synthesis = member.client.stream(self._text, **self._kwargs)
            await synthesis.__aenter__()
        except BaseException:
            self._member = None
            await self._router.release(member, self._voice, False)
            raise
        self._synthesis = synthesis

    async def _close(self, *, served: bool) -> None:
        synthesis, member = self._synthesis, self._member
        self._synthesis = self._member = None
        try:
            if synthesis is not None:
                with anyio.CancelScope(shield=True):
                    await synthesis.__aexit__(None, None, None)
                self.timings, self.facts, self.words = synthesis.timings, synthesis.facts, synthesis.words
        finally:
            if member is not None:
                await self._router.release(member, self._voice, served)

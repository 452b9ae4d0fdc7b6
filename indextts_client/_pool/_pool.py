"""A pool of sidecars behind the Client's API: one per GPU, or N of them on one machine.

::

    async with Pool("indextts2", devices=["cuda:0", "cuda:1"], engine_options=...) as pool:
        audio = await pool.synthesize("Hello.", voice="/voices/alice.wav")

* **Routing** decides under one lock and does I/O outside it: the member with the least
  outstanding work wins, except that a voice goes back to the member that served it last
  (whose conditioning is warm) unless that member has more than ``affinity_slack``
  requests more than the least busy one.  Members that are closed or dead (past their
  restart limit) are skipped.
* **Healing.**  A dead member is not lost for good: ``revive_after`` seconds after it went
  dead (by default its ``restart_window``) the pool starts it again (a spawned member) or
  reconnects (a remote one); each failed attempt doubles the wait, up to
  ``max_revive_after``.  :meth:`Pool.health` gives the seconds until the next attempt
  (``retry_in``).  A revived member has a fresh restart budget.
* **Limits that wait.**  Each member takes at most ``max_outstanding`` requests at once.
  When all are full, a request waits for room up to ``pool_timeout`` seconds, then
  raises :class:`BusyError`; it never floods the sidecars' own queues.
* **Retry.**  A request that fails because its member crashed or was busy, before any
  audio reached the caller, is retried on another member (``retries`` times, default
  once).  One that already delivered audio fails with the member's error: audio is
  never silently duplicated.
* **Several per GPU.**  ``per_device=N`` places N sidecars on each of ``devices``;
  ``mps=True`` runs them under a private NVIDIA MPS control daemon (:mod:`._mps`),
  started before them and stopped after them, and :meth:`Pool.mps_attached` (also run
  by :meth:`Pool.load`, and in :meth:`Pool.health`) tells which attached to it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

import anyio

from .._audio import Audio
from .._client import Client
from .._defaults import (
    DEFAULT_MAX_OUTSTANDING,
    DEFAULT_MAX_REVIVE_AFTER,
    DEFAULT_PER_DEVICE,
    DEFAULT_POOL_SIZE,
    DEFAULT_POOL_TIMEOUT,
    DEFAULT_RESTART_WINDOW,
)
from .._exceptions import ClosedError, EngineError, SidecarError, StartError, unwrap
from .._signature import CLIENT, REQUESTER, same_parameters
from .._stream_text import DEFAULT_LOOKAHEAD, DEFAULT_MAX_SENTENCE_CHARS
from .._supervision._detached import spawn_detached
from .._types import Health, LoadInfo, ServedStream
from ._mps import MpsDaemon
from ._routing import Member, Router, device_env
from ._stream import RETRYABLE, PoolStream

if TYPE_CHECKING:
    from .._stream_text import TextInput, TextStream

__all__ = ["MemberHealth", "Pool", "PoolLease", "PoolStream"]

log = logging.getLogger("indextts_client")

#: Client options that only make sense for a sidecar the client spawns itself.
_SPAWN_ONLY = frozenset(
    {"engine_options", "python", "command", "sidecar_args", "inherit_env", "cwd", "shared_audio", "exit_with_parent"}
)


@dataclass(frozen=True)
class MemberHealth:
    """One member of a :class:`Pool`, as :meth:`Pool.health` reports it."""

    index: int
    device: Union[str, None]
    #: ``"ready"``, ``"dead"`` (past its restart limit) or ``"closed"``.
    state: str
    #: Requests the pool has in flight on this member, and has completed there.
    outstanding: int
    served: int
    restarts: int
    pid: Union[int, None]
    #: The member's own answer to ``ping``; None when it could not answer.
    health: Union[Health, None]
    error: Union[str, None] = None
    #: The address of a remote member (``urls``); None for a member the pool spawned.
    url: Union[str, None] = None
    #: For a dead member: seconds until the pool next tries to revive it (0: now); else None.
    retry_in: Union[float, None] = None
    #: With ``mps=True``: whether its sidecar is a client of the pool's MPS daemon (False before
    #: its model loaded, or when it fell back to time-slicing); None without MPS.
    mps: Union[bool, None] = None


@dataclass(frozen=True)
class PoolLease:
    """A member held by :meth:`Pool.lease`: its client and its index in :attr:`Pool.members`."""

    client: Client
    index: int


class Pool:
    """Several sidecars behind one Client-like API.  See the module docstring.

    ``size`` sidecars, or ``per_device`` (default 1) per entry of ``devices`` (each with
    ``CUDA_VISIBLE_DEVICES`` pinned, so each sees its GPU as ``cuda:0``).  ``mps=True``
    shares each GPU between its sidecars through a private NVIDIA MPS daemon
    (:class:`~._mps.MpsUnavailableError` from :meth:`start` where there is no NVIDIA
    driver).  ``client_kwargs`` go to every :class:`Client` (``engine_options``,
    ``python``, ``env``, timeouts...).

    ``urls`` adds one member per running sidecar reached over a socket
    (``tcp://HOST:PORT``, ``unix:///PATH``; ``token`` and ``ssl_context`` apply to each),
    after the local ones.  With ``urls`` and neither ``size`` nor ``devices``, the pool
    spawns no sidecar of its own.

    ``revive_after`` (seconds; default: the members' ``restart_window``) and
    ``max_revive_after`` (default 600) pace the healing of dead members.

    ``load_on_start`` (default True): :meth:`start` loads the engine on every member, so that
    a pool that started can speak; an engine that cannot load fails the start
    (:class:`StartError`, ``code == "load_failed"``, the engine's one-line reason).  False
    leaves each member's model to load at its first request.
    """

    def __init__(
        self,
        engine: Union[str, None] = None,
        *,
        size: Union[int, None] = None,
        devices: Union[Sequence[str], None] = None,
        per_device: int = DEFAULT_PER_DEVICE,
        mps: bool = False,
        max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
        pool_timeout: Union[float, None] = DEFAULT_POOL_TIMEOUT,
        retries: int = 1,
        affinity_slack: int = 2,
        urls: Sequence[str] = (),
        token: Union[str, bytes, None] = None,
        ssl_context: Any = None,
        revive_after: Union[float, None] = None,
        max_revive_after: float = DEFAULT_MAX_REVIVE_AFTER,
        load_on_start: bool = True,
        **client_kwargs: Any,
    ) -> None:
        if isinstance(urls, str):
            raise TypeError("urls is a list of addresses, not one string")
        if isinstance(per_device, bool) or not isinstance(per_device, int) or per_device < 1:
            raise ValueError(f"per_device must be an int >= 1, not {per_device!r}")
        if per_device > 1 and devices is None:
            raise ValueError("per_device places sidecars on each of devices: give devices (or size alone)")
        if devices is not None:
            # Round robin over the devices: members next to each other are on different GPUs.
            devices = [device for _ in range(per_device) for device in devices]
        if devices is not None and size is not None and size != len(devices):
            raise ValueError("give size or devices, or a size equal to len(devices) * per_device")
        if devices is not None and not devices:
            raise ValueError("devices is empty")
        spawned = size if size is not None else (0 if urls else DEFAULT_POOL_SIZE)
        count = len(devices) if devices is not None else spawned
        if mps and count < 1:
            raise ValueError("mps=True shares a GPU between sidecars the pool spawns; this pool spawns none")
        if count < 0 or count + len(urls) < 1:
            raise ValueError("a pool needs at least one member")
        if max_outstanding < 1:
            raise ValueError("max_outstanding must be >= 1")
        if retries < 0 or affinity_slack < 0:
            raise ValueError("retries and affinity_slack must be >= 0")
        if revive_after is None:
            revive_after = float(client_kwargs.get("restart_window", DEFAULT_RESTART_WINDOW))
        if not revive_after > 0 or not max_revive_after >= revive_after:
            raise ValueError("revive_after must be > 0 and max_revive_after >= revive_after")
        members = []
        base_env = dict(client_kwargs.pop("env", None) or {})
        #: The private MPS daemon, when asked for: each spawned sidecar gets its directories.
        self._mps = MpsDaemon() if mps else None
        if self._mps is not None:
            base_env.update(self._mps.env)
        for index in range(count):
            device = devices[index] if devices is not None else None
            env = {**base_env, **(device_env(device) if device is not None else {})}
            members.append(Member(index, device, Client(engine, env=env, **client_kwargs)))
        remote_kwargs = {k: v for k, v in client_kwargs.items() if k not in _SPAWN_ONLY}
        for url in urls:
            client = Client(url=url, token=token, ssl_context=ssl_context, **remote_kwargs)
            members.append(Member(len(members), None, client, url=url))
        self._router = Router(
            members,
            max_outstanding=max_outstanding,
            pool_timeout=pool_timeout,
            affinity_slack=affinity_slack,
            on_release=self._wake_healer,
            revival_note=self._revival_note,
        )
        self._retries = retries
        self._load_on_start = load_on_start
        self._revive_after = revive_after
        self._max_revive_after = max_revive_after
        #: The healer: a task outside the caller's scopes, woken when a member may have died.
        self._heal_wake = anyio.Event()
        self._healer_done: Union[anyio.Event, None] = None

    # ------------------------------------------------------------ lifecycle

    @property
    def members(self) -> tuple[Client, ...]:
        """The members' clients, in order (for inspection; route requests through the pool)."""
        return tuple(m.client for m in self._router.members)

    async def __aenter__(self) -> Pool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: Union[type[BaseException], None],
        exc: Union[BaseException, None],
        tb: Union[TracebackType, None],
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start every member concurrently, then (``load_on_start``) load the engine on each; if one
        fails, stop the others and raise its error (a load's as a :class:`StartError`).

        With ``mps=True`` the MPS daemon starts first; where it cannot, nothing else does
        (:class:`~._mps.MpsUnavailableError`).
        """
        if self._mps is not None:
            await self._mps.start()
        try:
            async with anyio.create_task_group() as tg:
                for member in self._router.members:
                    tg.start_soon(member.client.start)
            if self._load_on_start:
                await self._load_all()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise _first_error(exc) from None
        self._router.started = True
        self._healer_done = anyio.Event()
        spawn_detached(self._heal, "indextts_client pool healer")

    async def _load_all(self) -> None:
        """Load the engine on every member; one that cannot is the pool's :class:`StartError`."""
        try:
            await self.load()
        except EngineError as exc:
            raise StartError(f"the engine cannot load: {exc.message}", code=exc.code) from exc

    async def aclose(self) -> None:
        """Stop every member (concurrently, shielded); waiting requests get :class:`ClosedError`."""
        self._router.closed = True
        with anyio.CancelScope(shield=True):
            await self._router.wake_all()
            self._heal_wake.set()
            if self._healer_done is not None:
                await self._healer_done.wait()
            async with anyio.create_task_group() as tg:
                for member in self._router.members:
                    tg.start_soon(member.client.aclose)
            if self._mps is not None:
                await self._mps.stop()  # after its clients: the sidecars have exited

    # ------------------------------------------------------------ healing

    async def _heal(self) -> None:
        """Revive dead members when they are due, until the pool closes (the healer task)."""
        done = self._healer_done
        assert done is not None
        try:
            async with anyio.create_task_group() as tg:
                while not self._router.closed:
                    self._heal_wake = anyio.Event()
                    now = anyio.current_time()
                    soonest = math.inf
                    for member in self._router.members:
                        due = self._due(member)
                        if due is None or member.reviving:
                            continue
                        if due <= now:
                            member.reviving = True
                            tg.start_soon(self._revive, member)
                        else:
                            soonest = min(soonest, due)
                    with anyio.move_on_after(soonest - now):
                        await self._heal_wake.wait()
                tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            raise  # the event loop is ending
        except BaseException:  # a detached task must never raise into the event loop
            log.exception("internal error in the pool's healer")
        finally:
            done.set()

    def _due(self, member: Member) -> Union[float, None]:
        """When the dead ``member`` should next be revived; None when it is not dead."""
        client = member.client
        dead_at = client.dead_since
        if client.closed or not client.dead or dead_at is None:
            member.revive_at = None
            return None
        if member.revive_at is None:
            member.revive_at = dead_at + self._revive_wait(member)
        return member.revive_at

    def _revive_wait(self, member: Member) -> float:
        return float(min(self._max_revive_after, self._revive_after * 2**member.revive_failures))

    async def _revive(self, member: Member) -> None:
        try:
            await member.client.revive()
        except Exception as exc:  # a SidecarError; anything else must not stop the healer either
            member.revive_failures += 1
            log.warning("pool member %d could not be revived: %s: %s", member.index, type(exc).__name__, exc)
        else:
            if member.client.dead:  # nothing was tried (the client cannot restart)
                member.revive_failures += 1
            else:
                member.revive_failures = 0
                log.info("pool member %d revived", member.index)
                await self._router.wake_all()
        finally:
            # Still dead: the next attempt waits twice as long, counted from now.
            member.revive_at = anyio.current_time() + self._revive_wait(member) if member.client.dead else None
            member.reviving = False
            self._heal_wake.set()

    def _wake_healer(self, member: Member) -> None:
        if member.client.dead:
            self._heal_wake.set()

    # ------------------------------------------------------------ routing

    @asynccontextmanager
    async def lease(self, voice: Union[str, None] = None) -> AsyncIterator[PoolLease]:
        """The member routing picks for ``voice``, held for the caller's own requests until the
        block ends, where it counts as one request in flight (waiting, or ``BusyError``, as one)."""
        member = await self._router.acquire(voice, set())
        served = False
        try:
            yield PoolLease(member.client, member.index)
            served = True
        finally:
            await self._router.release(member, voice, served)

    def _revival_note(self) -> str:
        now = anyio.current_time()
        due = [d for d in (self._due(m) for m in self._router.members) if d is not None]
        if not due or self._router.closed:
            return ""
        return f"; the next revival is in {max(0.0, min(due) - now):.1f} s"

    # ------------------------------------------------------------ requests

    @same_parameters(REQUESTER.synthesize)
    async def synthesize(self, text: str, **kwargs: Any) -> Audio:
        """As :meth:`Client.synthesize`, on the member routing picks; retried on another after a crash.

        ``timeout`` and ``idle_timeout`` bound each attempt on a member, as they bound a Client's request.
        """
        voice: Union[str, None] = kwargs.get("voice")
        tried: set[int] = set()
        for attempt in range(self._retries + 1):
            member = await self._router.acquire(voice, tried)
            served = False
            try:
                audio = await member.client.synthesize(text, **kwargs)
                served = True
                return audio
            except RETRYABLE:
                if attempt == self._retries:
                    raise
                tried.add(member.index)
            finally:
                await self._router.release(member, voice, served)
        raise AssertionError("unreachable")  # pragma: no cover

    @same_parameters(REQUESTER.stream)
    def stream(self, text: str, **kwargs: Any) -> PoolStream:
        """As :meth:`Client.stream`: ``async with pool.stream(text) as chunks: async for chunk in chunks``."""
        return PoolStream(self._router, self._retries, text, kwargs)

    async def load(self) -> list[LoadInfo]:
        """Load the model on every member (concurrently); returns each member's load info.

        With ``mps=True`` it then checks that each member attached to the MPS daemon and
        logs a warning for each that did not (it time-slices the GPU instead).
        """
        infos = await self._on_all(lambda client: client.load())
        if self._mps is not None:
            for member, attached in zip(self._router.members, await self.mps_attached(), strict=True):
                if attached is False:
                    log.warning(
                        "pool member %d (pid %s) is not attached to the pool's MPS daemon: it time-slices %s",
                        member.index,
                        member.client.pid,
                        member.device or "its GPU",
                    )
        return infos

    async def mps_attached(self) -> list[Union[bool, None]]:
        """Per member: whether its sidecar is a client of the pool's MPS daemon.

        False for one that has not loaded its model (CUDA attaches at its first use) or that
        fell back to time-slicing; None for a member with no process here (remote, not
        running).  Raises ``ValueError`` for a pool without ``mps=True``.
        """
        if self._mps is None:
            raise ValueError("this pool runs no MPS daemon (mps=True)")
        pids = [None if member.url is not None else member.client.pid for member in self._router.members]
        return await self._mps.attached(pids)

    async def unload(self) -> None:
        await self._on_all(lambda client: client.unload())

    async def register_voice(self, name: str, audio: Union[bytes, bytearray, memoryview]) -> str:
        """Upload a reference clip to every member (see :meth:`Client.register_voice`); returns the voice."""
        data = bytes(audio)
        voices = await self._on_all(lambda client: client.register_voice(name, data))
        return str(next(v for v in voices if v is not None))

    async def ping(self) -> list[Health]:
        """Every member's health, in member order."""
        if self._router.closed:
            raise ClosedError("the pool is closed")
        return await self._on_all(lambda client: client.ping())

    async def health(self, *, timeout: float = 5.0) -> list[MemberHealth]:  # noqa: ASYNC109
        """Per member: state, requests in flight, restarts, pid and its ping (memory, queue depth)."""
        reports: list[Union[MemberHealth, None]] = [None] * len(self._router.members)
        mps: list[Union[bool, None]] = [None] * len(self._router.members)
        if self._mps is not None and self._mps.running:
            try:
                with anyio.fail_after(timeout):
                    mps = await self.mps_attached()
            except (SidecarError, TimeoutError, OSError) as exc:
                log.warning("the pool's MPS daemon did not answer: %s", exc)

        async def probe(member: Member) -> None:
            client = member.client
            state = "closed" if client.closed else "dead" if client.dead else "ready"
            health: Union[Health, None] = None
            error = None
            due = self._due(member) if state == "dead" else None
            retry_in = None if due is None else max(0.0, due - anyio.current_time())
            if state == "dead" and client.dead_reason is not None:
                error = _summary_of(client.dead_reason)
                self._wake_healer(member)  # it may have died through its own client
            if state == "ready":
                try:
                    with anyio.fail_after(timeout):
                        health = await client.ping()
                except (SidecarError, TimeoutError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
            reports[member.index] = MemberHealth(
                index=member.index,
                device=member.device,
                state=state,
                outstanding=member.outstanding,
                served=member.served,
                restarts=client.restarts,
                pid=client.pid,
                health=health,
                error=error,
                url=member.url,
                retry_in=retry_in,
                mps=mps[member.index],
            )

        async with anyio.create_task_group() as tg:
            for member in self._router.members:
                tg.start_soon(probe, member)
        return [r for r in reports if r is not None]

    async def _on_all(self, call: Any) -> list[Any]:
        results: list[Any] = [None] * len(self._router.members)

        async def one(member: Member) -> None:
            results[member.index] = await call(member.client)

        try:
            async with anyio.create_task_group() as tg:
                for member in self._router.members:
                    if member.usable:
                        tg.start_soon(one, member)
        except BaseException as exc:
            raise _first_error(exc) from None
        return results

    @same_parameters(CLIENT.stream_text)
    def stream_text(
        self,
        texts: TextInput,
        *,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        **kwargs: Any,
    ) -> TextStream:
        """As :meth:`Client.stream_text`, every sentence on the one member routing picks for ``voice``
        (its conditioning stays warm); that member counts it as one request until the stream ends.
        A member that fails mid-stream fails the stream (its earlier sentences were heard)."""
        from .._stream_text import TextStream, pool_session

        def open_on(client: Client) -> Callable[[str], ServedStream]:
            def open_sentence(text: str) -> ServedStream:
                return client.stream(text, **kwargs)

            return open_sentence

        return TextStream(
            pool_session(self, kwargs.get("voice"), open_on),
            texts,
            lookahead=lookahead,
            max_sentence_chars=max_sentence_chars,
            text_format=kwargs.get("text_format", "text"),
        )


def _summary_of(exc: SidecarError) -> str:
    return f"{type(exc).__name__}: {exc.message}"


def _first_error(exc: BaseException) -> BaseException:
    """The first non-cancellation error inside a task group's exception group."""
    while True:
        exc = unwrap(exc)
        inner = getattr(exc, "exceptions", None)
        if not isinstance(exc, BaseException) or not isinstance(inner, tuple) or not inner:
            return exc
        errors = [e for e in inner if not isinstance(e, anyio.get_cancelled_exc_class())]
        exc = errors[0] if errors else inner[0]

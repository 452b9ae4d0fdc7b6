"""How a client reaches its sidecar: a spawned process, a listening socket, or the caller's streams.

Each transport's :meth:`~Transport.open` is an async context manager that yields the byte
streams (and the child process, when there is one) and on exit releases what it opened:
the process is reaped, the socket closed.  The supervisor runs one session inside each
``open()``, the same way for every transport; it never asks which one it has.
"""

from __future__ import annotations

import abc
import logging
import math
import os
import ssl
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import anyio
import msgspec
from anyio.abc import ByteReceiveStream, ByteSendStream, ByteStream

from indextts_sidecar.protocol.defaults import PARENT_ENV

from .._exceptions import StartError
from ._process import SidecarProcess

if TYPE_CHECKING:
    from indextts_sidecar.protocol.address import Address

    from ._settings import SidecarSettings

__all__ = [
    "Link",
    "SocketTransport",
    "SpawnTransport",
    "StreamsTransport",
    "Transport",
    "UnavailableTransport",
    "child_environment",
    "sidecar_command",
]

log = logging.getLogger("indextts_client")


def sidecar_command(
    engine: Union[str, None],
    engine_options: Union[Mapping[str, Any], None],
    *,
    python: Union[str, os.PathLike[str], None],
    command: Union[Sequence[Union[str, os.PathLike[str]]], None],
    sidecar_args: Sequence[str],
) -> list[str]:
    """The command line of a spawned sidecar: the prefix, ``--engine``, ``-o key=<json>``, the extra arguments."""
    if command is not None and python is not None:
        raise ValueError("give python or command, not both")
    if command is not None:
        argv = [os.fspath(part) for part in command]
    else:
        argv = [os.fspath(python) if python is not None else sys.executable, "-m", "indextts_sidecar"]
    if engine is not None:
        argv += ["--engine", engine]
    for key, value in (engine_options or {}).items():
        argv += ["-o", f"{key}={msgspec.json.encode(value).decode()}"]
    argv += list(sidecar_args)
    return argv


def child_environment(env: Union[Mapping[str, str], None], *, inherit_env: bool) -> dict[str, str]:
    """The spawned sidecar's environment: this process's (unless not inherited) updated with ``env``."""
    child_env = dict(os.environ) if inherit_env else {}
    child_env.update(env or {})
    return child_env


class Link(NamedTuple):
    """An open transport: the byte streams to the sidecar, and its process when we spawned it."""

    receive: ByteReceiveStream
    send: ByteSendStream
    child: Union[SidecarProcess, None]


class Transport(abc.ABC):
    """One way to reach a sidecar; :meth:`open` is called once per session."""

    #: Whether a new session may be opened once one has ended.
    restartable = True

    def __init__(self) -> None:
        #: The command line of a spawned sidecar; empty for the other transports.
        self.argv: list[str] = []
        #: The address of a listening sidecar, None for the other transports.
        self.url: Union[Address, None] = None

    @abc.abstractmethod
    def open(self, settings: SidecarSettings) -> AbstractAsyncContextManager[Link]:
        """Reach the sidecar; on exit, release what was opened (shielded, bounded)."""


class SpawnTransport(Transport):
    """A sidecar spawned as our child process, spoken to over its stdin and stdout."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: Union[str, os.PathLike[str], None],
        exit_with_parent: bool,
    ) -> None:
        super().__init__()
        self.argv = argv
        self.env = dict(env)
        self.cwd = cwd
        self.exit_with_parent = exit_with_parent

    @asynccontextmanager
    async def open(self, settings: SidecarSettings) -> AsyncIterator[Link]:
        env = self.env
        if self.exit_with_parent:
            # The sidecar stops once the spawning process is gone, even if a process forked
            # from it keeps the pipes open. The pid at spawn time: a client may be created
            # before a fork. An environment variable: older sidecars ignore it.
            env = {**env, PARENT_ENV: str(os.getpid())}
        child = await SidecarProcess.spawn(
            self.argv, env=env, cwd=self.cwd, redact=settings.redact, exit_grace=settings.shutdown_timeout
        )
        try:
            yield Link(child.stdout, child.stdin, child)
        finally:
            await child.aclose(settings.shutdown_timeout)
            log.debug("sidecar pid %d reaped (returncode %s)", child.pid, child.process.returncode)


class SocketTransport(Transport):
    """A sidecar listening on TCP (optionally TLS) or a Unix socket (``--listen``)."""

    def __init__(self, address: Address, *, ssl_context: Union[ssl.SSLContext, None]) -> None:
        super().__init__()
        if ssl_context is not None and address.scheme != "tcp":
            raise ValueError("ssl_context is for tcp:// addresses")
        self.url = address
        self.ssl_context = ssl_context

    @asynccontextmanager
    async def open(self, settings: SidecarSettings) -> AsyncIterator[Link]:
        stream = await self._connect(settings.ready_timeout)
        try:
            yield Link(stream, stream, None)
        finally:
            await _close_quietly(stream)

    async def _connect(self, limit: Union[float, None]) -> ByteStream:
        address = self.url
        assert address is not None
        try:
            with anyio.fail_after(math.inf if limit is None else limit):
                if address.scheme == "unix":
                    return await anyio.connect_unix(address.path)
                if self.ssl_context is not None:
                    return await anyio.connect_tcp(
                        address.host, address.port, ssl_context=self.ssl_context, tls_standard_compatible=False
                    )
                return await anyio.connect_tcp(address.host, address.port)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            raise StartError(f"cannot connect to the sidecar at {address}: {exc or type(exc).__name__}") from None


class StreamsTransport(Transport):
    """The caller's already connected streams (``Client.connect``): one session, no restart."""

    restartable = False

    def __init__(self, receive: ByteReceiveStream, send: ByteSendStream) -> None:
        super().__init__()
        self.receive = receive
        self.send = send

    @asynccontextmanager
    async def open(self, settings: SidecarSettings) -> AsyncIterator[Link]:
        try:
            yield Link(self.receive, self.send, None)
        finally:
            await _close_quietly(self.send)
            await _close_quietly(self.receive)


class UnavailableTransport(Transport):
    """No sidecar can be reached: opening raises :class:`StartError` with ``message`` (the fix)."""

    restartable = False

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    @asynccontextmanager
    async def open(self, settings: SidecarSettings) -> AsyncIterator[Link]:
        raise StartError(self.message)
        yield  # pragma: no cover - a generator, for asynccontextmanager


async def _close_quietly(stream: Union[ByteReceiveStream, ByteSendStream]) -> None:
    """Close ``stream``, shielded; a stream that is already closed or broken is fine."""
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except Exception:  # closing a broken stream
            pass

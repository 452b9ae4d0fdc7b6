"""``--listen``: serve many connections on a TCP or Unix socket over one engine.

Every accepted connection is authenticated first when a token is configured (see
:mod:`.protocol.auth`), then gets ``ready`` and a :class:`~._server.Server` of its own: its
own request ids, its own queue, its own writer.  All of them feed one
:class:`~._server.Scheduler`, so there is one engine thread, and the queues are served
round robin.  A connection that ends (closed, lost, framing broken, ``shutdown``) ends
its own requests only; the sidecar keeps listening until SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import anyio
import msgspec
from anyio.abc import ByteStream, Listener, SocketAttribute, TaskGroup

from . import protocol
from ._parent import stop_on_signal, stop_without_parent
from ._server import Scheduler, Server
from .protocol import auth as _auth
from .protocol.address import Address, is_loopback, parse_url
from .protocol.framing import FrameReader, FrameWriter, FramingError

__all__ = ["Address", "SocketService", "is_loopback", "parse_url"]

log = logging.getLogger("indextts_sidecar")

#: Seconds before a refused token is answered: the same for every failure, so nothing
#: can be learned from timing, and guessing costs a second per connection.
AUTH_DELAY = 1.0
#: Seconds a new connection has to complete the handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Largest frame read before a connection is authenticated.
_HANDSHAKE_FRAME = 4096
DEFAULT_MAX_CONNECTIONS = 64


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a sidecar that is gone; refuse one that still answers."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(f"{path!r} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(f"{path!r}: another process is listening on it")


async def open_listener(address: Address) -> Listener[Any]:
    if address.scheme == "unix":
        _remove_stale_socket(address.path)
        # Created 0600 from the start (umask), not chmod-ed after a window.
        old = os.umask(0o177)
        try:
            return await anyio.create_unix_listener(address.path, mode=0o600)
        finally:
            os.umask(old)
    return await anyio.create_tcp_listener(local_host=address.host, local_port=address.port)


def bound_url(listener: Listener[Any], address: Address) -> str:
    """The address actually bound (the port the system chose for port 0)."""
    if address.scheme == "unix":
        return str(address)
    inner = getattr(listener, "listeners", [listener])
    sockname = inner[0].extra(SocketAttribute.local_address)
    return str(Address("tcp", host=str(sockname[0]), port=int(sockname[1])))


class SocketService:
    """Accepts connections and serves each with its own :class:`Server` over one scheduler."""

    def __init__(
        self,
        engine: Any,
        ready: protocol.Ready,
        make_server: Callable[[Scheduler], Server],
        *,
        token: Union[bytes, None],
        ssl_context: Union[ssl.SSLContext, None] = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.scheduler = Scheduler(engine)
        self._ready = ready
        self._make_server = make_server
        self._token = token
        self._ssl = ssl_context
        self._max_connections = max_connections
        self._connections = 0
        #: Each served connection, with an event set once it has ended.
        self._servers: dict[Server, anyio.Event] = {}
        self._scope = anyio.CancelScope()
        self._tg: Union[TaskGroup, None] = None

    def stop(self) -> None:
        """Stop accepting, end every connection as at end of input (SIGTERM); safe to call twice."""
        self._scope.cancel()

    async def serve(self, listener: Listener[Any]) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                with self._scope:
                    await listener.serve(self._accepted, task_group=tg)
                # Stopping: each connection ends its requests and says so, then closes.
                ending = list(self._servers.items())
                for server, _ in ending:
                    server.stop()
                with anyio.move_on_after(HANDSHAKE_TIMEOUT):
                    for _, ended in ending:
                        await ended.wait()
                tg.cancel_scope.cancel()  # connections still in their handshake
        finally:
            self.scheduler.close()
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    async def _accepted(self, stream: ByteStream) -> None:
        self._connections += 1
        try:
            if self._ssl is not None:
                from anyio.streams.tls import TLSStream

                with anyio.move_on_after(HANDSHAKE_TIMEOUT):
                    stream = await TLSStream.wrap(
                        stream, server_side=True, ssl_context=self._ssl, standard_compatible=False
                    )
                if not isinstance(stream, TLSStream):
                    log.warning("a connection did not complete the TLS handshake in time; closed")
                    return
            await self._connection(stream)
        except (OSError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            log.info("a connection failed before it was served: %s", exc)
        except Exception:  # one connection's failure must never take the others down
            log.exception("internal error serving a connection")
        finally:
            self._connections -= 1
            with anyio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except Exception:
                    pass

    async def _connection(self, stream: ByteStream) -> None:
        writer = FrameWriter(stream)
        if self._connections > self._max_connections:
            await writer.send(
                protocol.Error(
                    code="busy",
                    retryable=True,
                    message=f"the sidecar serves {self._max_connections} connections already (--max-connections)",
                )
            )
            return
        if self._token is not None and not await self._authenticate(stream, writer):
            return
        server = self._make_server(self.scheduler)
        ended = self._servers[server] = anyio.Event()
        try:
            code = await server.serve(stream, stream, self._ready)
        finally:
            del self._servers[server]
            ended.set()
        log.info("a connection ended (code %d)", code)

    async def _authenticate(self, stream: ByteStream, writer: FrameWriter) -> bool:
        assert self._token is not None
        message = _auth.challenge()
        await writer.send_parts((_frame(message),))
        reader = FrameReader(stream, max_frame_size=_HANDSHAKE_FRAME, frame_timeout=HANDSHAKE_TIMEOUT)
        body: Union[memoryview, None] = None
        with anyio.move_on_after(HANDSHAKE_TIMEOUT):
            try:
                body = await reader.receive()
            except FramingError:
                body = None
        mac: object = None
        if body is not None:
            try:
                answer = msgspec.msgpack.decode(body)
            except msgspec.MsgspecError:
                answer = None
            if isinstance(answer, dict) and answer.get("op") == "auth":
                mac = answer.get("mac")
        if _auth.verify(self._token, message["nonce"], mac):
            return True
        log.warning("a connection failed to authenticate; closing it after %g s", AUTH_DELAY)
        await anyio.sleep(AUTH_DELAY)  # the fixed delay of every refusal, not synchronisation
        try:
            await writer.send(protocol.Error(code="unauthorized", message="authentication failed"))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        return False


def _frame(message: dict[str, Any]) -> bytes:
    body = msgspec.msgpack.encode(message)
    return len(body).to_bytes(protocol.HEADER, "big") + body


@dataclass(frozen=True)
class ListenConfig:
    """What ``--listen`` and its companion options asked for, checked."""

    address: Address
    token: Union[bytes, None]
    ssl_context: Union[ssl.SSLContext, None]
    max_connections: int


async def serve_socket(
    config: ListenConfig,
    engine: Any,
    ready: protocol.Ready,
    make_server: Callable[[Scheduler], Server],
    read_fd: int,
    write_fd: int,
    parent_pid: Union[int, None],
) -> int:
    """Bind, say where on stdout, serve until SIGTERM/SIGINT (or the parent is gone); the exit code."""
    try:
        listener = await open_listener(config.address)
    except OSError as exc:
        message = f"cannot listen on {config.address}: {exc}"
        log.error("%s", message)
        return 2
    url = bound_url(listener, config.address)
    service = SocketService(
        engine,
        ready,
        make_server,
        token=config.token,
        ssl_context=config.ssl_context,
        max_connections=config.max_connections,
    )
    log.info(
        "listening on %s (%s%s)",
        url,
        "token required" if config.token is not None else "no token",
        ", TLS" if config.ssl_context is not None else "",
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(stop_on_signal, service)
            # A parent (or a test) learns the bound address, port 0 resolved, from one line
            # on stdout, once SIGTERM is handled.
            try:
                os.write(write_fd, f"listening on {url}\n".encode())
            except OSError:
                pass
            os.close(write_fd)
            os.close(read_fd)
            if parent_pid is not None and parent_pid > 0:
                tg.start_soon(stop_without_parent, service, parent_pid)
            await service.serve(listener)
            tg.cancel_scope.cancel()
    finally:
        if config.address.scheme == "unix":
            try:
                os.unlink(config.address.path)
            except OSError:
                pass
    log.info("stopped listening on %s", url)
    return 0

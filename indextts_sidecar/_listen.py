"""``--listen``: serve many connections on a TCP or Unix socket over one engine.

Every accepted connection is authenticated first when a token is configured (see
:mod:`.protocol.auth`), then gets ``ready`` and a :class:`~._server.Server` of its own: its
own request ids, its own queue, its own writer.  All of them feed one
:class:`~._scheduler.Scheduler`, so there is one engine thread, and the queues are served
round robin.  A connection that ends (closed, lost, framing broken, ``shutdown``) ends
its own requests only; the sidecar keeps listening until SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

import anyio
import msgspec
from anyio.abc import ByteReceiveStream, ByteStream, Listener, SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from . import protocol
from ._parent import stop_on_signal, stop_without_parent
from ._server import Scheduler, Server
from .protocol import auth as _auth
from .protocol.address import Address, is_loopback, parse_url
from .protocol.framing import FrameWriter

__all__ = ["Address", "SocketService", "is_loopback", "parse_url"]

log = logging.getLogger("indextts_sidecar")

#: Seconds before a refused token is answered: the same for every failure, so nothing
#: can be learned from timing, and guessing costs a second per connection.
AUTH_DELAY = 1.0
#: Seconds a new connection has to complete its handshake (TLS, then the token): ``--handshake-timeout``.
DEFAULT_HANDSHAKE_TIMEOUT = 5.0
#: Connections in their handshake at once (``--max-handshakes``); a new one past it ends the oldest.
DEFAULT_MAX_HANDSHAKES = 32
#: Largest frame read before a connection is authenticated.
_HANDSHAKE_FRAME = 4096
#: Connections served at once, after their handshake (``--max-connections``).
DEFAULT_MAX_CONNECTIONS = 64
#: Seconds a connection has, on stopping, to end its requests and flush its replies.
_STOP_WAIT = 10.0
#: On a TLS listener, seconds without a byte from the peer after which it is taken for a plain
#: client (a TLS client speaks first, at once; a protocol v1 client waits for the sidecar) and
#: told, in plain frames, that TLS is expected.
_TLS_SILENCE = 2.0
#: The first byte of a TLS record carrying a handshake message (the ClientHello).
_TLS_HANDSHAKE_RECORD = 0x16


class _Replayed(ByteStream):
    """``stream`` with ``head`` put back in front of what it receives (a byte read to tell TLS from plain)."""

    def __init__(self, stream: ByteStream, head: bytes) -> None:
        self._stream = stream
        self._head = head

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._head:
            data, self._head = self._head[:max_bytes], self._head[max_bytes:]
            return data
        return await self._stream.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self._stream.extra_attributes


class _Pending:
    """A connection in its handshake: its deadline, and whether a newer one pushed it out."""

    __slots__ = ("evicted", "scope")

    def __init__(self, timeout: float) -> None:
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + timeout)
        self.evicted = False


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
    """Accepts connections and serves each with its own :class:`Server` over one scheduler.

    A connection is *pending* from its accept to the end of its handshake (TLS, then the
    token), with a deadline of ``handshake_timeout``; at most ``max_handshakes`` are, and a
    new one past that ends the oldest, so connections that never authenticate cannot keep
    out one that does (it needs its handshake's round trips only).  Then it is *served*,
    one of at most ``max_connections``; one more is refused ``busy``.
    """

    def __init__(
        self,
        engine: Any,
        ready: protocol.Ready,
        make_server: Callable[[Scheduler], Server],
        *,
        token: Union[bytes, None],
        ssl_context: Union[ssl.SSLContext, None] = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_handshakes: int = DEFAULT_MAX_HANDSHAKES,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        batch_wait: float = 0.0,
    ) -> None:
        self.scheduler = Scheduler(engine, batch_wait=batch_wait)
        self._ready = ready
        self._make_server = make_server
        self._token = token
        self._ssl = ssl_context
        self._max_connections = max_connections
        self._max_handshakes = max_handshakes
        self._handshake_timeout = handshake_timeout
        #: Connections in their handshake, oldest first (a dict keeps the order).
        self._pending: dict[_Pending, None] = {}
        #: Connections past their handshake, served or being refused ``busy``.
        self._served = 0
        #: Each served connection, with an event set once it has ended.
        self._servers: dict[Server, anyio.Event] = {}
        self._scope = anyio.CancelScope()

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._pending)

    def stop(self) -> None:
        """Stop accepting, end every connection as at end of input (SIGTERM); safe to call twice."""
        self._scope.cancel()

    async def serve(self, listener: Listener[Any]) -> None:
        try:
            async with anyio.create_task_group() as tg:
                with self._scope:
                    await listener.serve(self._accepted, task_group=tg)
                # Stopping: each connection ends its requests and says so, then closes.
                ending = list(self._servers.items())
                for server, _ in ending:
                    server.stop()
                for pending in list(self._pending):
                    pending.evicted = True  # (no warning: they end with the sidecar)
                    pending.scope.cancel()
                with anyio.move_on_after(_STOP_WAIT):
                    for _, ended in ending:
                        await ended.wait()
                tg.cancel_scope.cancel()
        finally:
            self.scheduler.close()
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    def _admit(self) -> _Pending:
        """A new connection starts its handshake; the oldest pending one ends if there are too many."""
        while len(self._pending) >= self._max_handshakes:
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            oldest.evicted = True
            oldest.scope.cancel()
        pending = _Pending(self._handshake_timeout)
        self._pending[pending] = None
        return pending

    async def _accepted(self, raw: ByteStream) -> None:
        stream: ByteStream = raw
        try:
            pending = self._admit()
            opened: Union[tuple[ByteStream, ByteReceiveStream], None] = None
            try:
                with pending.scope:
                    opened = await self._handshake(raw)
            finally:
                self._pending.pop(pending, None)
            if opened is None:
                if pending.evicted and not self._scope.cancel_called:
                    log.info(
                        "a connection still in its handshake was closed: %d newer ones arrived (--max-handshakes)",
                        self._max_handshakes,
                    )
                elif pending.scope.cancelled_caught and not pending.evicted:
                    log.warning(
                        "a connection did not complete its handshake within %g s (--handshake-timeout); closed",
                        self._handshake_timeout,
                    )
                return
            stream, receive = opened
            await self._serve(stream, receive)
        except (OSError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream, anyio.IncompleteRead) as exc:
            log.info("a connection failed before it was served: %s", exc)
        except Exception:  # one connection's failure must never take the others down
            log.exception("internal error serving a connection")
        finally:
            with anyio.CancelScope(shield=True):
                for closing in (stream, raw):
                    try:
                        await closing.aclose()
                    except Exception:
                        pass

    async def _handshake(self, raw: ByteStream) -> Union[tuple[ByteStream, ByteReceiveStream], None]:
        """TLS, then the token: the streams to serve once both hold, else None (the reason logged)."""
        stream = raw
        if self._ssl is not None:
            tls = await self._start_tls(raw)
            if tls is None:
                return None
            stream = tls
        receive: ByteReceiveStream = stream
        if self._token is not None:
            # Reads exactly the frame it needs, so nothing sent right behind ``auth`` is
            # lost; whatever it did hold would go on to the serving reader first.
            buffered = BufferedByteReceiveStream(stream)
            if not await self._authenticate(buffered, FrameWriter(stream)):
                return None
            if buffered.buffer:
                receive = buffered
        return stream, receive

    async def _start_tls(self, raw: ByteStream) -> Union[ByteStream, None]:
        from anyio.streams.tls import TLSStream

        first = b""
        with anyio.move_on_after(min(_TLS_SILENCE, self._handshake_timeout / 2)):
            first = await raw.receive(1)
        if first[:1] != bytes([_TLS_HANDSHAKE_RECORD]):
            # Silence, or bytes that are no TLS record: a client speaking plain frames.
            log.warning("a connection spoke no TLS to this TLS listener; told so and closed")
            with anyio.move_on_after(self._handshake_timeout):
                await FrameWriter(raw).send(
                    protocol.Error(
                        code="tls_required",
                        message="this sidecar serves TLS on this address: connect with TLS (an ssl_context)",
                    )
                )
            return None
        return await TLSStream.wrap(
            _Replayed(raw, first), server_side=True, ssl_context=self._ssl, standard_compatible=False
        )

    async def _serve(self, stream: ByteStream, receive: ByteReceiveStream) -> None:
        self._served += 1
        try:
            if self._served > self._max_connections:
                with anyio.move_on_after(self._handshake_timeout):
                    await FrameWriter(stream).send(
                        protocol.Error(
                            code="busy",
                            retryable=True,
                            message=f"the sidecar serves {self._max_connections} connections already "
                            "(--max-connections)",
                        )
                    )
                return
            server = self._make_server(self.scheduler)
            ended = self._servers[server] = anyio.Event()
            try:
                code = await server.serve(receive, stream, self._ready)
            finally:
                del self._servers[server]
                ended.set()
            log.info("a connection ended (code %d)", code)
        finally:
            self._served -= 1

    async def _authenticate(self, stream: BufferedByteReceiveStream, writer: FrameWriter) -> bool:
        assert self._token is not None
        message = _auth.challenge()
        await writer.send_parts((_frame(message),))
        mac: object = None
        size = int.from_bytes(await stream.receive_exactly(protocol.HEADER), "big")
        if size <= _HANDSHAKE_FRAME:
            body = await stream.receive_exactly(size)
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
    max_handshakes: int = DEFAULT_MAX_HANDSHAKES
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT


async def serve_socket(
    config: ListenConfig,
    engine: Any,
    ready: protocol.Ready,
    make_server: Callable[[Scheduler], Server],
    read_fd: int,
    write_fd: int,
    parent_pid: Union[int, None],
    batch_wait: float = 0.0,
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
        max_handshakes=config.max_handshakes,
        handshake_timeout=config.handshake_timeout,
        batch_wait=batch_wait,
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

"""Listening (``tcp://`` or ``unix://``, on a socket of our own), serving, and the command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union
from urllib.parse import urlparse

from indextts_sidecar.protocol.options import parse_options

from .._exceptions import StartError
from .._pool._cli import ServerParser, add_pool_arguments
from .._pool._pool import Pool
from .._service import PoolBackend, Refusal, ServeSettings, add_ssml_arguments, add_voice_arguments
from ._handler import Limits, WyomingService

__all__ = ["main", "serve"]

log = logging.getLogger("indextts_client.wyoming")


@dataclass
class _Listener:
    server: asyncio.AbstractServer
    #: ``tcp://HOST:PORT`` (the real port) or ``unix://PATH``.
    address: str
    port: Union[int, None] = None
    path: Union[str, None] = None


def _unix_path(uri: str) -> str:
    path = uri[len("unix://") :]
    if not path:
        raise ValueError(f"--uri {uri!r}: give unix://PATH")
    return path


def _clear_stale_socket(path: str) -> None:
    """Remove a socket left behind by a server that is gone; refuse anything else at ``path``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ValueError(f"{path!r} exists and is not a socket; not replacing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # nobody listens there: stale
            return
        except OSError as exc:
            raise ValueError(f"{path!r}: cannot tell whether a server listens there ({exc.strerror})") from None
    raise ValueError(f"{path!r}: another server is listening there")


def _bind_unix(path: str, mode: int) -> socket.socket:
    """A socket bound at ``path`` with ``mode``: created owner-only, then given the mode asked
    for, so that it is never more open than asked (whatever the umask)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        previous = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(previous)
        os.chmod(path, mode)
    except BaseException:
        sock.close()
        raise
    return sock


async def _listen(
    uri: str, accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any], *, limit: int, mode: int
) -> _Listener:
    """Bind ``uri`` (not yet accepting); ``ValueError`` for a bad URI, ``OSError`` when it cannot be bound."""
    parsed = urlparse(uri)
    if parsed.scheme == "tcp":
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"--uri {uri!r}: give tcp://HOST:PORT")
        server = await asyncio.start_server(accept, parsed.hostname, parsed.port, limit=limit, start_serving=False)
        host, port = server.sockets[0].getsockname()[:2]
        return _Listener(server, f"tcp://{host}:{port}", port=port)
    if parsed.scheme == "unix":
        path = _unix_path(uri)
        _clear_stale_socket(path)
        sock = _bind_unix(path, mode)
        server = await asyncio.start_unix_server(accept, sock=sock, limit=limit, start_serving=False)
        return _Listener(server, f"unix://{path}", path=path)
    raise ValueError(f"--uri {uri!r}: give tcp://HOST:PORT or unix://PATH")


async def serve(
    service: WyomingService,
    uri: str,
    *,
    zeroconf: Union[str, None] = None,
    ready: Union[Callable[[str], Any], None] = None,
    handle_signals: bool = True,
    socket_mode: int = 0o600,
) -> None:
    """Listen on ``uri``, start the backend, serve until cancelled or SIGTERM/SIGINT.

    ``ready(address)`` hears the bound address (a ``tcp://HOST:PORT`` with the real port).
    A ``unix://`` socket gets ``socket_mode``.
    """
    # The event line, and each of its parts, within max_event_bytes (readuntil's bound).
    listener = await _listen(uri, service.accept, limit=service.limits.max_event_bytes + 1, mode=socket_mode)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for signum in signals:
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread, or Windows
            pass
    try:
        await service.backend.start()
        try:
            if service.default_voice is not None:
                await service.prepare(None)  # a default voice that names nothing is refused now, not per request
            await listener.server.start_serving()
            if listener.port is not None and zeroconf is not None:
                await _announce(listener.port, zeroconf or None)
            log.warning("wyoming: listening on %s", listener.address)
            if ready is not None:
                ready(listener.address)
            await stop.wait()
        finally:
            listener.server.close()
            await service.close_connections(grace=5.0)
            await service.backend.aclose()
    finally:
        listener.server.close()
        if listener.path is not None:
            try:
                os.unlink(listener.path)
            except FileNotFoundError:
                pass
        for signum in signals:
            try:
                loop.remove_signal_handler(signum)
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover
                pass


async def _announce(port: int, name: Union[str, None]) -> None:
    try:
        from wyoming.zeroconf import HomeAssistantZeroconf
    except ImportError as exc:
        raise RuntimeError(f"--zeroconf needs the zeroconf package: pip install zeroconf ({exc})") from None
    await HomeAssistantZeroconf(port=port, name=name).register_server()


# ---------------------------------------------------------------------- command line


def _octal_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode (600, 660)") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mode between 000 and 777")
    return mode


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = ServerParser(prog=prog, description="A Wyoming (Home Assistant) TTS server.")
    parser.add_argument("--uri", required=True, help="tcp://HOST:PORT or unix://PATH (port 0: any free port)")
    add_pool_arguments(parser)
    add_voice_arguments(parser, parser.add_argument_group("uploaded voices"))
    parser.add_argument("--default-voice", help="the voice when a request names none (default: the first --voice)")
    parser.add_argument(
        "--language",
        action="append",
        default=None,
        help="a language of the voices whose own are unknown: clips, uploads (default: en, zh)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="request option")
    parser.add_argument("--zeroconf", nargs="?", const="", default=None, metavar="NAME", help="announce on mDNS")
    parser.add_argument("--socket-mode", type=_octal_mode, default=0o600, help="a unix:// socket's mode (600)")
    defaults = Limits()
    limit = parser.add_argument
    limit("--max-connections", type=int, default=defaults.max_connections, help="connections at once (%(default)s)")
    limit("--max-event-bytes", type=int, default=defaults.max_event_bytes, help="bytes per event part (%(default)s)")
    limit("--max-text-chars", type=int, default=defaults.max_text_chars, help="characters a request (%(default)s)")
    limit("--idle-timeout", type=float, default=defaults.idle_timeout, help="idle seconds (%(default)s)")
    limit("--write-timeout", type=float, default=defaults.write_timeout, help="seconds an event's send (%(default)s)")
    add_ssml_arguments(parser)
    return parser


def main(argv: Union[list[str], None] = None, prog: str = "indextts-client wyoming") -> int:
    """``indextts-client wyoming --uri tcp://HOST:PORT``: a Wyoming TTS server over a pool."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    settings = ServeSettings.from_args(args, parser)
    try:
        options = parse_options(args.set)
    except ValueError as exc:
        parser.error(f"--set: {exc}")
    limits = Limits(
        max_connections=args.max_connections,
        max_event_bytes=args.max_event_bytes,
        max_text_chars=args.max_text_chars,
        idle_timeout=args.idle_timeout,
        write_timeout=args.write_timeout,
        max_silence=settings.max_silence,
    )
    if min(limits.max_connections, limits.max_event_bytes, limits.max_text_chars) < 1:
        parser.error("the --max-* limits must be >= 1")
    if not (limits.idle_timeout > 0 and limits.write_timeout > 0):
        parser.error("--idle-timeout and --write-timeout must be > 0")
    service = WyomingService(
        PoolBackend(Pool(settings.engine, **settings.pool)),
        sources=settings.sources(),
        languages=args.language,
        default_voice=args.default_voice,
        limits=limits,
        options=options,
    )
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        asyncio.run(serve(service, args.uri, zeroconf=args.zeroconf, socket_mode=args.socket_mode))
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except Refusal as refusal:
        print(f"{prog}: {refusal.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: cannot listen on {args.uri}: {os.strerror(exc.errno) if exc.errno else exc}", file=sys.stderr)
        return 1
    except (StartError, RuntimeError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0

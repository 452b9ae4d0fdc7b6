"""``indextts-client serve`` / ``python -m indextts_client.http``: the app under uvicorn, as a server.

It binds first and prints its URL, answers ``/health`` 503 ``starting`` while the sidecars
start, exits 1 with the reason when they cannot, and on SIGTERM stops accepting, lets the
responses in flight finish for ``--grace`` seconds, then cancels them.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from typing import Any, Union

from .._defaults import DEFAULT_PER_DEVICE
from .._pool._cli import DefaultsFormatter, ServerParser, add_pool_arguments
from .._service import ServeSettings, add_ssml_arguments, add_voice_arguments, positive
from ._limits import Limits, header_deadline_protocol
from ._ws_events import WebSocketLimits, stall_aborting_protocol

__all__ = ["main"]

KEY_ENV = "INDEXTTS_API_KEY"
_INT, _FLOAT = positive(int), positive(float)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0 to 65535; 0: any free port)")
    return value


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = ServerParser(
        prog=prog,
        description="An OpenAI-compatible speech endpoint (docs/serving.md in the source repository).",
        formatter_class=DefaultsFormatter,
    )
    add_pool_arguments(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (non-loopback needs a key or --public)"
    )
    parser.add_argument("--port", type=_port, default=8000, help="TCP port to listen on")
    parser.add_argument("--fd", type=int, help="serve on this already bound listening socket instead")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--api-key-file", help="require Authorization: Bearer KEY on /v1/*, KEY read from this file")
    keys.add_argument("--api-key", help=f"the key itself (visible to local users in ps; prefer ${KEY_ENV} or the file)")
    parser.add_argument("--public", action="store_true", help="allow a non-loopback host without an API key")
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (https://app.example) allowed to call the API and open the WebSocket; * for any",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name a server without a key answers, besides IP addresses and localhost",
    )
    parser.add_argument("--no-playground", action="store_true", help="do not serve the playground page at /")
    bounds = parser.add_argument_group("bounds (docs/reliability.md in the source repository)")
    add_voice_arguments(parser, bounds)
    limits = Limits()
    bounds.add_argument("--max-body", type=_INT, default=limits.max_body, help="bytes of a speech request's body")
    bounds.add_argument("--max-upload", type=_INT, default=limits.max_upload, help="bytes of a voice upload's body")
    bounds.add_argument("--max-input", type=_INT, default=limits.max_input, help="characters of input")
    add_ssml_arguments(bounds)
    bounds.add_argument("--body-timeout", type=_FLOAT, default=limits.body_timeout, help="seconds to send a body")
    bounds.add_argument("--max-in-flight", type=_INT, default=limits.max_in_flight, help="requests at once (503 past)")
    bounds.add_argument(
        "--max-unauthorized", type=_INT, default=limits.max_unauthorized, help="requests without the key at once"
    )
    bounds.add_argument("--write-timeout", type=_FLOAT, default=30.0, help="seconds a response may wait for its client")
    bounds.add_argument("--header-timeout", type=_FLOAT, default=10.0, help="seconds to send a request's head")
    bounds.add_argument("--keep-alive-timeout", type=_INT, default=5, help="seconds an idle connection is kept")
    bounds.add_argument("--max-connections", type=_INT, default=512, help="connections and requests (uvicorn)")
    bounds.add_argument("--max-header-bytes", type=_INT, default=16 * 1024, help="bytes of a request's head")
    bounds.add_argument("--grace", type=_INT, default=30, help="seconds in-flight responses get on SIGTERM")
    ws = WebSocketLimits()
    for flag, default, what in (
        ("--ws-max-connections", ws.max_connections, "WebSocket connections with the key at once (503 past)"),
        ("--ws-max-unauthenticated", ws.max_unauthenticated, "WebSocket connections not yet showing the key"),
        ("--ws-max-contexts", ws.max_contexts, "contexts open at once on one WebSocket"),
        ("--ws-max-message", ws.max_message, "bytes of one WebSocket message from a client"),
        ("--ws-max-pending-chars", ws.max_pending_chars, "characters of a context's text not yet taken"),
    ):
        bounds.add_argument(flag, type=_INT, default=default, help=what)
    bounds.add_argument("--ws-auth-timeout", type=_FLOAT, default=ws.auth_timeout, help="seconds to show the key")
    bounds.add_argument("--ws-idle-timeout", type=_FLOAT, default=ws.idle_timeout, help="seconds a WebSocket is idle")
    bounds.add_argument("--ws-write-timeout", type=_FLOAT, default=ws.write_timeout, help="seconds a frame may wait")
    return parser


def _api_key(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Union[str, None]:
    """From the file, the environment or the flag; the environment variable is removed, so
    that no sidecar (whose environment is inherited from this process) can read it."""
    from_env = os.environ.pop(KEY_ENV, None)
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as file:
                key = file.read().strip()
        except OSError as exc:
            parser.error(f"--api-key-file: cannot read it: {exc.strerror}")
        if not key:
            parser.error("--api-key-file: the file is empty")
        return key
    return args.api_key or from_env or None


def _check_host(parser: argparse.ArgumentParser, args: argparse.Namespace, key: Union[str, None]) -> None:
    if args.fd is not None or key is not None or args.public:
        return
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        parser.error(f"--host {args.host} is not loopback: give --api-key-file, or --public to serve it open")


def _app_kwargs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    settings = ServeSettings.from_args(args, parser)
    return {
        **settings.pool,
        "voices": dict(settings.voices),
        "voice_dir": settings.voice_dir,
        "voice_limits": settings.voice_limits,
        "playground": not args.no_playground,
        "cors_origins": tuple(args.cors_origin),
        "allowed_hosts": tuple(args.allowed_host),  # checked (without a key): DNS rebinding
        "limits": Limits(
            max_body=args.max_body,
            max_upload=args.max_upload,
            max_input=args.max_input,
            body_timeout=args.body_timeout,
            max_in_flight=args.max_in_flight,
            max_unauthorized=args.max_unauthorized,
            max_silence=settings.max_silence,
        ),
        "websocket_limits": _websocket_limits(args),
    }


def _websocket_limits(args: argparse.Namespace) -> WebSocketLimits:
    return WebSocketLimits(
        max_connections=args.ws_max_connections,
        max_unauthenticated=args.ws_max_unauthenticated,
        auth_timeout=args.ws_auth_timeout,
        max_contexts=args.ws_max_contexts,
        max_message=args.ws_max_message,
        max_pending_chars=args.ws_max_pending_chars,
        idle_timeout=args.ws_idle_timeout,
        write_timeout=args.ws_write_timeout,
    )


def _listen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[socket.socket, str]:
    if args.fd is not None:
        sock = socket.socket(fileno=args.fd)
    else:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY only then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as exc:
            sock.close()
            parser.exit(1, f"{parser.prog}: cannot listen on {args.host}:{args.port}: {exc.strerror}\n")
        sock.listen(2048)
    host, port = sock.getsockname()[:2]
    return sock, f"http://{f'[{host}]' if ':' in host else host}:{port}"


def main(argv: Union[list[str], None] = None, prog: str = "python -m indextts_client.http") -> int:
    import uvicorn

    from ._app import create_app

    parser = _parser(prog)
    args = parser.parse_args(argv)
    key = _api_key(parser, args)
    _check_host(parser, args, key)
    kwargs = _app_kwargs(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("indextts_client.http", "indextts_client.service"):
        logging.getLogger(name).setLevel(logging.INFO)
    failures: list[BaseException] = []
    server: Any = None

    def failed(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    app = create_app(args.engine, api_key=key, on_start_failure=failed, **kwargs)
    config = uvicorn.Config(
        app,
        log_level="warning",
        http=header_deadline_protocol(args.header_timeout, args.write_timeout),
        ws=stall_aborting_protocol(kwargs["websocket_limits"]),
        timeout_keep_alive=args.keep_alive_timeout,
        limit_concurrency=args.max_connections,
        h11_max_incomplete_event_size=args.max_header_bytes,
        timeout_graceful_shutdown=args.grace,
        ws_max_size=args.ws_max_message,  # the app checks it too, for an app served another way
    )
    server = uvicorn.Server(config)
    sock, url = _listen(parser, args)
    per_device = kwargs.get("per_device", DEFAULT_PER_DEVICE)
    sidecars = len(kwargs["devices"]) * per_device if "devices" in kwargs else kwargs["size"]
    print(
        f"{prog}: listening on {url} (engine {args.engine}, starting {sidecars} sidecar(s))",
        file=sys.stderr,
        flush=True,
    )
    server.run(sockets=[sock])
    if failures:
        exc = failures[0]
        print(f"{prog}: the engine could not start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0

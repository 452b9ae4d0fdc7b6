"""``python -m indextts_sidecar``: parse arguments, protect the pipes, serve, send ``ready``.

The order matters.  fd 1 moves out of reach before anything can print.  ``ready`` goes
out once the server reads requests, so that it means usable: a request sent after it is
answered at once, not after the event loop's imports.  It still comes before any engine
dependency is imported (the model loads at the first request or ``load``), and a sidecar
that cannot start (unknown engine, bad options) answers with an ``error`` frame instead.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import TYPE_CHECKING, Any, Union

import msgspec

from . import protocol
from ._defaults import (
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_MAX_OUTGOING,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_TEXT,
    DEFAULT_MAX_VOICE_BYTES,
)
from ._version import __version__
from .protocol.defaults import PARENT_ENV, SHARED_AUDIO_FD_ENV
from .protocol.options import parse_options

if TYPE_CHECKING:
    from ._wire import Wire

EXIT_USAGE = 2
#: The ``--wire`` names (see :func:`wire_named`).
WIRE_NAMES = ("msgpack", "seed")


def wire_named(name: str, max_frame_size: int) -> Wire:
    """A fresh wire of that name, for one connection (a wire may keep state of its connection)."""
    if name == "seed":
        from ._seedwire import SeedWire

        return SeedWire(max_frame_size)
    if name == "msgpack":
        from ._wire import MsgpackWire

        return MsgpackWire()
    raise LookupError(f"unknown wire {name!r}; known: {', '.join(WIRE_NAMES)}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m indextts_sidecar",
        description="Serve a TTS engine over protocol v1 on stdin/stdout (see docs/protocol.md).",
    )
    parser.add_argument(
        "--engine",
        default=None,
        help="engine name (default: espeak; with --doctor: the IndexTTS checks); see --list-engines",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine option; VALUE is read as JSON when it parses, else as a string (repeatable)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help=f"requests waiting for the engine before 'busy' (default {DEFAULT_MAX_QUEUE})",
    )
    parser.add_argument(
        "--max-frame-size",
        type=int,
        default=None,
        help=f"largest frame accepted or sent, in bytes (default {protocol.DEFAULT_MAX_FRAME_SIZE}; "
        "with --wire seed 67108864, the seed's)",
    )
    parser.add_argument(
        "--wire",
        choices=WIRE_NAMES,
        default="msgpack",
        help="the frames' format: msgpack, protocol v1 (default); seed, the length-prefixed JSON of the "
        "one-file sidecar this project grew from, one request at a time (stdin/stdout only; docs/protocol.md)",
    )
    parser.add_argument(
        "--frame-timeout",
        type=float,
        default=DEFAULT_FRAME_TIMEOUT,
        help="seconds a started frame may take to arrive in full before framing counts as lost "
        f"(default {DEFAULT_FRAME_TIMEOUT:g})",
    )
    parser.add_argument(
        "--shared-audio-fd",
        default=None,
        metavar="FD",
        help=argparse.SUPPRESS,  # from older clients: the descriptor is closed, audio uses the pipe
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        metavar="PID",
        help=f"stop (as on SIGTERM) once process PID is gone; also {PARENT_ENV} (see docs/protocol.md)",
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="with an engine that batches, how long a lone request waits for others to share its batch "
        "(default 0: it starts at once)",
    )
    _add_limit_arguments(parser)
    _add_socket_arguments(parser)
    _add_other_arguments(parser)
    parser.add_argument("--version", action="version", version=f"indextts-sidecar {__version__}")
    return parser


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one request, and the parent's unread replies, may take."""
    parser.add_argument(
        "--max-text",
        type=int,
        default=DEFAULT_MAX_TEXT,
        help=f"longest request text in characters; longer ones get invalid_input (default {DEFAULT_MAX_TEXT})",
    )
    parser.add_argument(
        "--max-outgoing",
        type=int,
        default=DEFAULT_MAX_OUTGOING,
        help="replies queued for a parent that does not read them before requests stop being read "
        f"(default {DEFAULT_MAX_OUTGOING})",
    )
    parser.add_argument(
        "--voice-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="only files inside DIR may be named as voice or emotion references (repeatable; default: any; "
        "with --listen, none: voices are uploaded)",
    )
    parser.add_argument(
        "--max-voice-bytes",
        type=int,
        default=DEFAULT_MAX_VOICE_BYTES,
        help="largest voice or emotion reference file, named or registered, in bytes "
        f"(default {DEFAULT_MAX_VOICE_BYTES // 2**20} MiB)",
    )


def _add_socket_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `--listen`: addresses, authentication, TLS, and each connection's bounds."""
    sockets = parser.add_argument_group("sockets (see docs/protocol.md, 'Sockets')")
    sockets.add_argument(
        "--listen",
        metavar="URL",
        help="serve many connections on tcp://HOST:PORT or unix:///PATH instead of stdin/stdout; "
        "prints 'listening on URL' on stdout once bound",
    )
    sockets.add_argument(
        "--token-file", metavar="FILE", help="shared secret (16 bytes or more) a connection must prove it holds"
    )
    sockets.add_argument(
        "--insecure", action="store_true", help="allow tcp:// without --token-file (loopback addresses only)"
    )
    sockets.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain (tcp:// only)")
    sockets.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    sockets.add_argument(
        "--max-connections",
        type=int,
        default=64,
        help="authenticated connections served at once; more are refused 'busy' (default 64)",
    )
    sockets.add_argument(
        "--max-handshakes",
        type=int,
        default=32,
        help="connections in their handshake (TLS, token) at once; a new one past it closes the oldest (default 32)",
    )
    sockets.add_argument(
        "--handshake-timeout",
        type=float,
        default=5.0,
        help="seconds a new connection has to complete TLS and the token exchange (default 5)",
    )
    sockets.add_argument(
        "--write-timeout",
        type=float,
        default=10.0,
        help="seconds in which a connection must take 256 KiB of the replies offered, else its running request "
        "is cancelled and it is closed (default 10)",
    )
    sockets.add_argument(
        "--max-voices",
        type=int,
        default=256,
        help="reference clips register_voice may store under the first --voice-dir (default 256)",
    )
    sockets.add_argument(
        "--max-voice-total-bytes",
        type=int,
        default=512 * 1024 * 1024,
        help="bytes of all the clips register_voice stores together (default 512 MiB)",
    )
    sockets.add_argument(
        "--max-voice-names",
        type=int,
        default=1024,
        help="names register_voice keeps, each naming one clip (default 1024)",
    )
    sockets.add_argument(
        "--max-voice-seconds",
        type=float,
        default=300.0,
        help="longest clip register_voice takes, in seconds of audio (default 300)",
    )


def _add_other_arguments(parser: argparse.ArgumentParser) -> None:
    """Logging, and the commands that print and exit instead of serving."""
    parser.add_argument("--log-level", default="INFO", help="stderr log level (default INFO)")
    parser.add_argument("--list-engines", action="store_true", help="print the known engine names and exit")
    parser.add_argument(
        "--describe-engines",
        action="store_true",
        help="print one JSON list: each engine's name, description, native rate, capabilities, availability",
    )
    parser.add_argument(
        "--doctor",
        action="store_true",
        help="print a JSON report on this venv (torch, GPUs, indextts, checkpoints) and exit; see docs/indextts.md",
    )
    parser.add_argument("--model-dir", help="checkpoint directory for --doctor to check")


def _drop_shared_audio(flag: Union[str, None]) -> None:
    """Close the shared-memory descriptor an older client may pass: audio always uses the pipe.

    Such a client offers the memory with ``--shared-audio-fd`` or the variable, and uses it
    only when ``ready`` lists ``shared_audio``, which this sidecar never does.
    """
    named = os.environ.pop(SHARED_AUDIO_FD_ENV, None)  # not for the engine's children
    for value in (flag, named):
        number = _fd_number(value) if value is not None else None
        if number is not None and number > 2:
            try:
                os.close(number)
            except OSError:
                pass


def _fd_number(text: str) -> Union[int, None]:
    """``text`` as a descriptor number (ASCII decimal digits, below 2^31), else None."""
    if not (text.isascii() and text.isdigit()) or len(text) > 10:
        return None
    number = int(text)
    return number if number < 2**31 else None


def _startup_error(write_fd: int, wire: str, code: str, message: str, field: Union[str, None]) -> int:
    """Report a failure to start: one ``error`` frame (no id) in the wire's format, the same text on stderr, exit 2."""
    sys.stderr.write(f"indextts_sidecar: {message}\n")
    sys.stderr.flush()
    detail = {"field": field} if field else {}
    if write_fd < 0:
        return EXIT_USAGE
    error = protocol.Error(
        code=code, message=message, detail={**detail, "stage": "startup"} if wire == "seed" else detail
    )
    frame = wire_named(wire, protocol.DEFAULT_MAX_FRAME_SIZE).encode(error)
    try:
        if frame is not None:
            os.write(write_fd, frame[0])
    except OSError:
        pass
    return EXIT_USAGE


def _info(args: Any) -> Union[int, None]:
    """Run ``--list-engines``, ``--doctor`` or ``--describe-engines``, if asked for; their exit status."""
    if args.list_engines:
        from .engines import engine_names

        print("\n".join(engine_names()))
        return 0
    if args.doctor:
        from ._doctor import main as doctor_main

        return doctor_main(args.model_dir, engine=args.engine)
    if args.describe_engines:
        from .engines import describe_engine, engine_names

        sys.stdout.buffer.write(msgspec.json.encode([describe_engine(name) for name in engine_names()]) + b"\n")
        return 0
    return None


def _check_arguments(args: Any) -> Union[tuple[str, str], None]:
    """The first problem with the serving arguments, as (message, option); None if there is none."""
    if args.wire == "seed" and args.listen is not None:
        return "--wire seed serves standard input and output only, not --listen", "--wire"
    for directory in args.voice_dir:
        if not os.path.isdir(directory):
            return f"--voice-dir {directory!r} is not a directory", "--voice-dir"
    counts = (
        ("--max-text", args.max_text),
        ("--max-outgoing", args.max_outgoing),
        ("--max-voice-bytes", args.max_voice_bytes),
        ("--max-connections", args.max_connections),
        ("--max-voices", args.max_voices),
        ("--max-voice-total-bytes", args.max_voice_total_bytes),
        ("--max-voice-names", args.max_voice_names),
        ("--max-handshakes", args.max_handshakes),
    )
    for name, value in counts:
        if value < 1:
            return f"{name} must be at least 1", name
    for name, seconds in (
        ("--max-voice-seconds", args.max_voice_seconds),
        ("--handshake-timeout", args.handshake_timeout),
        ("--write-timeout", args.write_timeout),
    ):
        if not (math.isfinite(seconds) and seconds > 0):
            return f"{name} must be more than 0 and finite", name
    if not (math.isfinite(args.batch_wait_ms) and 0 <= args.batch_wait_ms <= 10_000):
        return "--batch-wait-ms must be between 0 and 10000", "--batch-wait-ms"
    return None


def main(argv: Union[list[str], None] = None) -> int:
    args = _parser().parse_args(argv)
    informed = _info(args)
    if informed is not None:
        return informed
    from ._fds import take_over_stdio

    try:
        read_fd, write_fd = take_over_stdio()
    except OSError as exc:  # fd 0 or 1 closed: there is no stream to serve, nor one to say so on
        sys.stderr.write(f"indextts_sidecar: standard input and output must be open: {exc.strerror}\n")
        return EXIT_USAGE
    # A listening sidecar's stdout is one text line ("listening on URL"), never frames; a seed
    # parent, which reads frames whatever the arguments, is told why this one does not start.
    frame_fd = write_fd if args.listen is None or args.wire == "seed" else -1
    if args.max_frame_size is None:
        from ._seedwire import SEED_MAX_FRAME_SIZE

        args.max_frame_size = SEED_MAX_FRAME_SIZE if args.wire == "seed" else protocol.DEFAULT_MAX_FRAME_SIZE
    problem = _check_arguments(args)
    if problem is not None:
        return _startup_error(frame_fd, args.wire, "invalid_option", *problem)
    if args.max_frame_size < protocol.MIN_MAX_FRAME_SIZE:
        return _startup_error(
            write_fd,
            args.wire,
            "invalid_option",
            f"--max-frame-size must be at least {protocol.MIN_MAX_FRAME_SIZE}",
            "--max-frame-size",
        )
    listen = None
    if args.listen is not None:
        checked = _check_listen(args)
        if isinstance(checked, tuple):
            return _startup_error(frame_fd, args.wire, "invalid_option", *checked)
        listen = checked
    from .engines import engine_class

    args.engine = args.engine or "espeak"
    try:
        cls = engine_class(args.engine)
    except LookupError as exc:
        return _startup_error(frame_fd, args.wire, "unknown_engine", str(exc), "--engine")
    try:
        options = msgspec.convert(parse_options(args.option), cls.Options, strict=False)
    except (ValueError, msgspec.ValidationError) as exc:
        return _startup_error(frame_fd, args.wire, "invalid_option", f"engine {args.engine!r}: {exc}", "--option")
    engine = cls(options)
    _drop_shared_audio(args.shared_audio_fd)
    # A socket without --voice-dir: requests name no files; clips are uploaded (register_voice)
    # into a private directory made below, removed at exit.
    uploads_only = listen is not None and not args.voice_dir
    ready = protocol.Ready(
        protocol=protocol.PROTOCOL_VERSION,
        version=__version__,
        engine=cls.name or args.engine,
        pid=os.getpid(),
        max_frame_size=args.max_frame_size,
        sample_rate=engine.sample_rate,
        max_batch=max(1, int(engine.max_batch)),
        capabilities=[
            *cls.capabilities,
            *(["registered_voices"] if args.voice_dir or uploads_only else []),
        ],
        options=msgspec.to_builtins(options),
    )
    import logging

    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    return _serve(args, engine, ready, listen, uploads_only, read_fd, write_fd, frame_fd)


def _parent_pid(args: Any) -> Union[int, None]:
    """The process whose end stops this one: ``--parent-pid``, else the environment's."""
    named_parent = os.environ.pop(PARENT_ENV, None)
    given: Union[int, None] = args.parent_pid
    if given is not None or not named_parent:
        return given
    parent_pid = _fd_number(named_parent)  # the same rules: ASCII digits below 2^31
    if parent_pid is None:
        sys.stderr.write(f"indextts_sidecar: ignoring {PARENT_ENV}={named_parent!r}: not a process id\n")
    return parent_pid


def _serve(
    args: Any,
    engine: Any,
    ready: protocol.Ready,
    listen: Any,
    uploads_only: bool,
    read_fd: int,
    write_fd: int,
    frame_fd: int,
) -> int:
    """Serve stdin/stdout, or the socket of ``--listen``, until the end; the exit status."""
    import logging

    import anyio

    from ._paths import PathPolicy
    from ._server import Scheduler, Server

    parent_pid = _parent_pid(args)
    private: Union[str, None] = None
    if uploads_only:
        import tempfile

        private = tempfile.mkdtemp(prefix="indextts-voices-")
        logging.getLogger("indextts_sidecar").warning(
            "listening without --voice-dir: requests may name no files, voices must be uploaded (register_voice); "
            "they are kept in a private temporary directory, removed at exit"
        )
    voice_dirs = [private] if private is not None else args.voice_dir
    paths = PathPolicy(voice_dirs, args.max_voice_bytes)
    voices = None
    if voice_dirs:
        voices = _voice_store(args, voice_dirs[0])
        if isinstance(voices, str):
            return _startup_error(frame_fd, args.wire, "invalid_option", voices, "--voice-dir")

    def make_server(scheduler: Union[Scheduler, None] = None) -> Server:
        return Server(
            engine,
            max_queue=args.max_queue,
            max_frame_size=args.max_frame_size,
            frame_timeout=args.frame_timeout if args.frame_timeout > 0 else None,
            max_text=args.max_text,
            max_outgoing=args.max_outgoing,
            paths=paths,
            scheduler=scheduler,
            voices=voices,
            write_timeout=args.write_timeout if listen is not None else None,
            path_voices=not uploads_only,
            wire=wire_named(args.wire, args.max_frame_size),
            batch_wait=args.batch_wait_ms / 1000,
        )

    if listen is not None:
        import functools

        from ._listen import serve_socket

        try:
            serve = functools.partial(serve_socket, batch_wait=args.batch_wait_ms / 1000)
            code: int = anyio.run(serve, listen, engine, ready, make_server, read_fd, write_fd, parent_pid)
        finally:
            if private is not None:
                import shutil

                shutil.rmtree(private, ignore_errors=True)
    else:
        code = anyio.run(_serve_stdio, make_server, ready, read_fd, write_fd, parent_pid)
    sys.stderr.flush()
    if engine_thread_busy():
        # An engine stuck in native code must not hold the exit hostage.
        os._exit(code)
    return code


def _voice_store(args: Any, directory: str) -> Any:
    """The store of registered voices in ``directory``, or what is wrong with it (a str)."""
    from ._voices import RegisteredVoices
    from .voicestore import VoiceLimits, VoiceStoreError

    store_limits = VoiceLimits(
        max_clip_bytes=args.max_voice_bytes,
        max_clips=args.max_voices,
        max_total_bytes=args.max_voice_total_bytes,
        max_names=args.max_voice_names,
        max_clip_seconds=args.max_voice_seconds,
    )
    try:
        return RegisteredVoices(directory, store_limits)
    except (OSError, VoiceStoreError) as exc:
        return f"the voice store in --voice-dir: {exc}"


async def _serve_stdio(
    make_server: Any, ready: protocol.Ready, read_fd: int, write_fd: int, parent_pid: Union[int, None]
) -> int:
    """Serve the one connection of stdin/stdout; the exit status."""
    import anyio

    from ._parent import stop_on_signal, stop_without_parent
    from .protocol.streams import FdReceiveStream, FdSendStream

    server = make_server()  # in the event loop: it makes its cancel scope
    async with anyio.create_task_group() as tg:
        await tg.start(stop_on_signal, server)  # SIGTERM stops it cleanly from ``ready`` on
        if parent_pid is not None and parent_pid > 0:
            tg.start_soon(stop_without_parent, server, parent_pid)
        # ``ready`` goes out from the serving server: a request sent after it is read at once.
        receive = FdReceiveStream(read_fd)
        # Requests from a file (or /dev/null), not a parent: all of them run, then the sidecar ends.
        server.drain_at_eof = not receive.pollable
        code: int = await server.serve(receive, FdSendStream(write_fd), ready)
        tg.cancel_scope.cancel()
    return code


def _check_listen(args: Any) -> Union[Any, tuple[str, str]]:
    """The ``--listen`` settings, checked; or (message, option) of the first problem."""
    from ._listen import ListenConfig, is_loopback, parse_url
    from .protocol.auth import load_token

    try:
        address = parse_url(args.listen)
    except ValueError as exc:
        return str(exc), "--listen"
    token = None
    if args.token_file is not None:
        try:
            token = load_token(args.token_file)
        except (OSError, ValueError) as exc:
            return f"--token-file: {exc}", "--token-file"
    elif address.scheme == "tcp":
        if not is_loopback(address.host):
            return (
                f"refusing to listen on {address} without --token-file: anyone who can reach it could use it",
                "--token-file",
            )
        if not args.insecure:
            return (
                f"refusing to listen on {address} without --token-file; on a loopback address, "
                "--insecure allows it (every local user can then connect)",
                "--token-file",
            )
    ssl_context = None
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together", "--tls-cert"
    if args.tls_cert is not None:
        if address.scheme != "tcp":
            return "TLS is for tcp:// addresses", "--tls-cert"
        import ssl

        try:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            return f"--tls-cert/--tls-key: {exc}", "--tls-cert"
    return ListenConfig(
        address,
        token,
        ssl_context,
        args.max_connections,
        max_handshakes=args.max_handshakes,
        handshake_timeout=args.handshake_timeout,
    )


#: Seconds the engine thread has to end once its scheduler is closed, before the process
#: leaves without it.  An idle one ends at once; one stuck in native code never does.
ENGINE_EXIT_WAIT = 0.2


def engine_thread_busy(wait: float = ENGINE_EXIT_WAIT) -> bool:
    """Whether the engine thread still runs ``wait`` seconds on (its scheduler is closed by now)."""
    import threading

    for thread in threading.enumerate():
        if thread.name == "indextts-engine":
            thread.join(wait)
            if thread.is_alive():
                return True
    return False

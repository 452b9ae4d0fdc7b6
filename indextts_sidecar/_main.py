"""``python -m indextts_sidecar``: parse arguments, protect the pipes, serve, send ``ready``.

The order matters.  fd 1 moves out of reach before anything can print.  ``ready`` goes
out once the server reads requests, so that it means usable: a request sent after it is
answered at once, not after the event loop's imports.  It still comes before any engine
dependency is imported (the model loads at the first request or ``load``), and a sidecar
that cannot start (unknown engine, bad options) answers with an ``error`` frame instead.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Union

import msgspec

from . import protocol
from ._arguments import WIRE_NAMES, check_arguments, parser
from ._settings import SidecarFlags
from ._version import __version__
from .protocol.defaults import PARENT_ENV, SHARED_AUDIO_FD_ENV
from .protocol.options import parse_options

if TYPE_CHECKING:
    from ._wire import Wire

EXIT_USAGE = 2


def wire_named(name: str, max_frame_size: int) -> Wire:
    """A fresh wire of that name, for one connection (a wire may keep state of its connection)."""
    if name == "seed":
        from ._seedwire import SeedWire

        return SeedWire(max_frame_size)
    if name == "msgpack":
        from ._wire import MsgpackWire

        return MsgpackWire()
    raise LookupError(f"unknown wire {name!r}; known: {', '.join(WIRE_NAMES)}")


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


def main(argv: Union[list[str], None] = None) -> int:
    args = parser().parse_args(argv)
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
    problem = check_arguments(args)
    if problem is not None:
        return _startup_error(frame_fd, args.wire, "invalid_option", *problem)
    settings = SidecarFlags.from_args(args)  # from here on, nothing reads ``args``
    if settings.max_frame_size < protocol.MIN_MAX_FRAME_SIZE:
        return _startup_error(
            write_fd,
            settings.wire,
            "invalid_option",
            f"--max-frame-size must be at least {protocol.MIN_MAX_FRAME_SIZE}",
            "--max-frame-size",
        )
    listen = None
    if settings.listen is not None:
        checked = _check_listen(settings, settings.listen)
        if isinstance(checked, tuple):
            return _startup_error(frame_fd, settings.wire, "invalid_option", *checked)
        listen = checked
    from .engines import engine_class

    try:
        cls = engine_class(settings.engine)
    except LookupError as exc:
        return _startup_error(frame_fd, settings.wire, "unknown_engine", str(exc), "--engine")
    try:
        options = msgspec.convert(parse_options(list(settings.options)), cls.Options, strict=False)
    except (ValueError, msgspec.ValidationError) as exc:
        message = f"engine {settings.engine!r}: {exc}"
        return _startup_error(frame_fd, settings.wire, "invalid_option", message, "--option")
    engine = cls(options)
    _drop_shared_audio(settings.shared_audio_fd)
    # A socket without --voice-dir: requests name no files; clips are uploaded (register_voice)
    # into a private directory made below, removed at exit.
    uploads_only = listen is not None and not settings.voice_dir
    ready = protocol.Ready(
        protocol=protocol.PROTOCOL_VERSION,
        version=__version__,
        engine=cls.name or settings.engine,
        pid=os.getpid(),
        max_frame_size=settings.max_frame_size,
        sample_rate=engine.sample_rate,
        max_batch=max(1, int(engine.max_batch)),
        capabilities=[
            *cls.capabilities,
            *(["registered_voices"] if settings.voice_dir or uploads_only else []),
        ],
        options=msgspec.to_builtins(options),
        speed=cls.speed,
    )
    import logging

    logging.basicConfig(
        stream=sys.stderr,
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    return _serve(settings, engine, ready, listen, uploads_only, read_fd, write_fd, frame_fd)


def _parent_pid(settings: SidecarFlags) -> Union[int, None]:
    """The process whose end stops this one: ``--parent-pid``, else the environment's."""
    named_parent = os.environ.pop(PARENT_ENV, None)
    given = settings.parent_pid
    if given is not None or not named_parent:
        return given
    parent_pid = _fd_number(named_parent)  # the same rules: ASCII digits below 2^31
    if parent_pid is None:
        sys.stderr.write(f"indextts_sidecar: ignoring {PARENT_ENV}={named_parent!r}: not a process id\n")
    return parent_pid


def _serve(
    settings: SidecarFlags,
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

    parent_pid = _parent_pid(settings)
    private: Union[str, None] = None
    if uploads_only:
        import tempfile

        private = tempfile.mkdtemp(prefix="indextts-voices-")
        logging.getLogger("indextts_sidecar").warning(
            "listening without --voice-dir: requests may name no files, voices must be uploaded (register_voice); "
            "they are kept in a private temporary directory, removed at exit"
        )
    voice_dirs = [private] if private is not None else list(settings.voice_dir)
    paths = PathPolicy(voice_dirs, settings.max_voice_bytes)
    voices = None
    if voice_dirs:
        voices = _voice_store(settings, voice_dirs[0])
        if isinstance(voices, str):
            return _startup_error(frame_fd, settings.wire, "invalid_option", voices, "--voice-dir")

    def make_server(scheduler: Union[Scheduler, None] = None) -> Server:
        return Server(
            engine,
            max_queue=settings.max_queue,
            max_frame_size=settings.max_frame_size,
            frame_timeout=settings.frame_deadline,
            max_text=settings.max_text,
            max_outgoing=settings.max_outgoing,
            paths=paths,
            scheduler=scheduler,
            voices=voices,
            write_timeout=settings.write_timeout if listen is not None else None,
            path_voices=not uploads_only,
            wire=wire_named(settings.wire, settings.max_frame_size),
            batch_wait=settings.batch_wait,
        )

    if listen is not None:
        import functools

        from ._listen import serve_socket

        try:
            serve = functools.partial(serve_socket, batch_wait=settings.batch_wait)
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


def _voice_store(settings: SidecarFlags, directory: str) -> Any:
    """The store of registered voices in ``directory``, or what is wrong with it (a str)."""
    from ._voices import RegisteredVoices
    from .voicestore import VoiceLimits, VoiceStoreError

    store_limits = VoiceLimits(
        max_clip_bytes=settings.max_voice_bytes,
        max_clips=settings.max_voices,
        max_total_bytes=settings.max_voice_total_bytes,
        max_names=settings.max_voice_names,
        max_clip_seconds=settings.max_voice_seconds,
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


def _check_listen(settings: SidecarFlags, url: str) -> Union[Any, tuple[str, str]]:
    """The ``--listen URL`` settings, checked; or (message, option) of the first problem."""
    from ._listen import ListenConfig, is_loopback, parse_url
    from .protocol.auth import load_token

    try:
        address = parse_url(url)
    except ValueError as exc:
        return str(exc), "--listen"
    token = None
    if settings.token_file is not None:
        try:
            token = load_token(settings.token_file)
        except (OSError, ValueError) as exc:
            return f"--token-file: {exc}", "--token-file"
    elif address.scheme == "tcp":
        if not is_loopback(address.host):
            return (
                f"refusing to listen on {address} without --token-file: anyone who can reach it could use it",
                "--token-file",
            )
        if not settings.insecure:
            return (
                f"refusing to listen on {address} without --token-file; on a loopback address, "
                "--insecure allows it (every local user can then connect)",
                "--token-file",
            )
    ssl_context = None
    if (settings.tls_cert is None) != (settings.tls_key is None):
        return "--tls-cert and --tls-key go together", "--tls-cert"
    if settings.tls_cert is not None:
        if address.scheme != "tcp":
            return "TLS is for tcp:// addresses", "--tls-cert"
        import ssl

        try:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(settings.tls_cert, settings.tls_key)
        except (OSError, ssl.SSLError) as exc:
            return f"--tls-cert/--tls-key: {exc}", "--tls-cert"
    return ListenConfig(
        address,
        token,
        ssl_context,
        settings.max_connections,
        max_handshakes=settings.max_handshakes,
        handshake_timeout=settings.handshake_timeout,
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

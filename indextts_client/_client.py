"""The public :class:`Client`: its arguments, properties and lifecycle.

The sessions behind it (spawning, the handshake, restarts within a budget, the
heartbeat, the stop ladder) are its :class:`~indextts_client._supervision._supervisor.Supervisor`'s;
a request asks the supervisor for the current :class:`Connection`.
"""

from __future__ import annotations

import os
import ssl
import warnings
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

from anyio.abc import ByteReceiveStream, ByteSendStream

from indextts_sidecar.protocol.address import parse_url

from ._defaults import (
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_HEARTBEAT_MISSES,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_MAX_RESTART_BACKOFF,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_RESTART_BACKOFF,
    DEFAULT_RESTART_WINDOW,
    DEFAULT_SHUTDOWN_TIMEOUT,
)
from ._exceptions import RestartLimitError
from ._registry import discover
from ._stream_text import DEFAULT_LOOKAHEAD, DEFAULT_MAX_SENTENCE_CHARS
from ._supervision._process import Redactor
from ._supervision._settings import SidecarSettings
from ._supervision._supervisor import Supervisor
from ._supervision._transports import (
    SocketTransport,
    SpawnTransport,
    StreamsTransport,
    Transport,
    UnavailableTransport,
    child_environment,
    sidecar_command,
)
from ._types import RestartCallback, ServedStream, SidecarInfo
from ._wire._request import Requester, merge_options

if TYPE_CHECKING:
    from ._stream_text import TextInput, TextStream
    from ._wire._request import EmotionLike, TextFormat, TimeoutArg

__all__ = ["Client"]


class Client(Requester):
    """Runs a TTS sidecar in a child process and sends it requests.

    ::

        async with Client("indextts2", engine_options={"model_dir": "checkpoints"}) as client:
            audio = await client.synthesize("Hello", voice="speaker.wav")
            audio.to_wav("hello.wav")

    Requests run concurrently over the one sidecar.  When it dies, pending requests fail
    with :class:`CrashedError` and the next call starts a new one, within the restart
    budget.  Its stderr goes to the ``indextts_client.sidecar`` logger, with Hugging Face
    tokens, the values of secret-named environment variables (TOKEN, KEY, SECRET,
    PASSWORD) and the strings in ``redact`` replaced by ``***``.

    The process:

    * ``engine``: the engine's name (``--engine``); None leaves the sidecar's default.
    * ``engine_options``: a mapping; each item is passed as ``-o key=<json>``.
    * ``python``: the interpreter that runs ``-m indextts_sidecar`` (default: this one; for an
      IndexTTS engine given no ``model_dir`` either, the environment ``indextts-client setup``
      registered, with its ``model_dir``, and :class:`StartError` naming the setup command
      when there is none).
    * ``command``: replaces ``[python, "-m", "indextts_sidecar"]``, e.g.
      ``["uv", "run", "python", "-m", "indextts_sidecar"]``.
    * ``sidecar_args``: appended to the command line.
    * ``env``: added to this process's environment (the whole environment with
      ``inherit_env=False``).
    * ``inherit_env``: whether the child's environment starts from ``os.environ``.
    * ``cwd``: the child's working directory.
    * ``exit_with_parent``: the sidecar stops once this process is gone, even if a
      process forked from it keeps the pipes open.

    A sidecar on a socket, instead of a process (``python -m indextts_sidecar --listen URL``):

    * ``url``: ``"tcp://HOST:PORT"`` or ``"unix:///PATH"``; when the connection drops, the
      next call reconnects, with the restart backoff and budget below.
    * ``token``: the shared secret of its ``--token-file``; a refused one raises
      :class:`AuthenticationError`.
    * ``ssl_context``: TLS, for ``tcp://``.

    Starting and stopping:

    * ``ready_timeout``: seconds :meth:`start` (and each restart) waits for ``ready``; it
      fails at once if the child exits first.
    * ``shutdown_timeout``: seconds each step of :meth:`aclose`'s stop ladder may take
      (``shutdown``; closing stdin and SIGTERM to the process group; SIGKILL), shielded
      from cancellation.

    Requests:

    * ``timeout``: every request's default overall deadline (None: no limit).
    * ``idle_timeout``: every request's default deadline without a progress or audio frame.
    * ``pool_timeout``: when the sidecar's queue is full (``--max-queue``), how long a
      request waits for another request of this client to end and is sent again (with
      none in flight: at once, then after pauses that double up to 0.1 s) before it raises
      :class:`BusyError`; None: at once.
    * ``frame_timeout``: seconds a started frame may take to arrive in full.
    * ``max_buffered``: audio bytes one request may hold unconsumed before it alone fails
      with :class:`BufferFullError`.
    * ``redact``: more strings to hide in logs and error messages.
    * ``shared_audio``: deprecated and ignored (a :class:`DeprecationWarning`).

    Supervision:

    * ``max_restarts``: automatic restarts allowed within ``restart_window`` seconds; one
      more makes the client dead: every call raises :class:`RestartLimitError`.
    * ``restart_window``: seconds.
    * ``restart_backoff``: seconds before a restart, doubled per restart in the window.
    * ``max_restart_backoff``: the cap on that delay.
    * ``on_restart``: ``on_restart(attempt, reason)``, a function or coroutine function,
      hears of each restart before it happens.
    * ``heartbeat``: seconds between health pings (None: none).
    * ``heartbeat_misses``: pings in a row without a pong after which the sidecar counts as
      hung: a child is killed, a socket dropped.
    """

    def __init__(
        self,
        engine: Union[str, None] = None,
        *,
        engine_options: Union[Mapping[str, Any], None] = None,
        python: Union[str, os.PathLike[str], None] = None,
        command: Union[Sequence[Union[str, os.PathLike[str]]], None] = None,
        sidecar_args: Sequence[str] = (),
        env: Union[Mapping[str, str], None] = None,
        inherit_env: bool = True,
        cwd: Union[str, os.PathLike[str], None] = None,
        ready_timeout: Union[float, None] = DEFAULT_READY_TIMEOUT,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        timeout: Union[float, None] = None,
        idle_timeout: Union[float, None] = DEFAULT_IDLE_TIMEOUT,
        pool_timeout: Union[float, None] = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window: float = DEFAULT_RESTART_WINDOW,
        restart_backoff: float = DEFAULT_RESTART_BACKOFF,
        max_restart_backoff: float = DEFAULT_MAX_RESTART_BACKOFF,
        on_restart: Union[RestartCallback, None] = None,
        frame_timeout: Union[float, None] = DEFAULT_FRAME_TIMEOUT,
        redact: Iterable[str] = (),
        shared_audio: Union[int, None] = None,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        heartbeat: Union[float, None] = None,
        heartbeat_misses: int = DEFAULT_HEARTBEAT_MISSES,
        exit_with_parent: bool = True,
        url: Union[str, None] = None,
        token: Union[str, bytes, None] = None,
        ssl_context: Union[ssl.SSLContext, None] = None,
    ) -> None:
        # An IndexTTS engine named without an interpreter or a model_dir: the registered environment.
        found = discover(engine, python=python, command=command, engine_options=engine_options)
        child_env = {**found.env, **child_environment(env, inherit_env=inherit_env)}
        transport: Transport
        if found.missing is not None and url is None:
            transport = UnavailableTransport(found.missing)
        elif url is not None:
            if engine is not None or command is not None or python is not None:
                raise ValueError("give url (a running sidecar) or engine/command/python (one to spawn), not both")
            transport = SocketTransport(parse_url(url), ssl_context=ssl_context)
        elif token is not None or ssl_context is not None:
            raise ValueError("token and ssl_context are for a sidecar reached by url")
        else:
            argv = sidecar_command(
                engine, found.engine_options, python=found.python, command=command, sidecar_args=sidecar_args
            )
            transport = SpawnTransport(argv, env=child_env, cwd=cwd, exit_with_parent=exit_with_parent)
        if shared_audio is not None:
            warnings.warn(
                "Client(shared_audio=...) is ignored: audio always travels through the pipe "
                "(the shared-memory ring did not pay for itself; docs/benchmarks.md in the source repository)",
                DeprecationWarning,
                stacklevel=2,
            )
        settings = SidecarSettings(
            redact=Redactor(child_env, redact),
            ready_timeout=ready_timeout,
            shutdown_timeout=shutdown_timeout,
            timeout=timeout,
            idle_timeout=idle_timeout,
            frame_timeout=frame_timeout,
            max_buffered=max_buffered,
            token=token,
            max_restarts=max_restarts,
            restart_window=restart_window,
            restart_backoff=restart_backoff,
            max_restart_backoff=max_restart_backoff,
            on_restart=on_restart,
            heartbeat=heartbeat,
            heartbeat_misses=heartbeat_misses,
        )
        self._attach(Supervisor(transport, settings), pool_timeout)

    def _attach(self, supervisor: Supervisor, pool_timeout: Union[float, None]) -> None:
        """Take ``supervisor``'s sidecars; requests default to its settings' deadlines."""
        if pool_timeout is not None and pool_timeout < 0:
            raise ValueError("pool_timeout must be >= 0")
        self._default_timeout = supervisor.settings.timeout
        self._default_idle_timeout = supervisor.settings.idle_timeout
        self._default_pool_timeout = pool_timeout
        self._supervisor = supervisor
        self._connection = supervisor.connection

    @classmethod
    def connect(
        cls,
        receive_stream: ByteReceiveStream,
        send_stream: ByteSendStream,
        *,
        ready_timeout: Union[float, None] = DEFAULT_READY_TIMEOUT,
        timeout: Union[float, None] = None,
        idle_timeout: Union[float, None] = DEFAULT_IDLE_TIMEOUT,
        frame_timeout: Union[float, None] = DEFAULT_FRAME_TIMEOUT,
        redact: Iterable[str] = (),
        pool_timeout: Union[float, None] = None,
    ) -> Client:
        """A client over an already connected sidecar (TCP, Unix socket, in-memory streams).

        The client owns the streams and closes them in :meth:`aclose`.  It cannot
        restart such a sidecar: after the stream ends, every call raises the error
        that ended it.  The arguments are as for a spawned sidecar.
        """
        settings = SidecarSettings(
            redact=Redactor({}, redact),
            ready_timeout=ready_timeout,
            timeout=timeout,
            idle_timeout=idle_timeout,
            frame_timeout=frame_timeout,
            max_restarts=0,
        )
        client = cls.__new__(cls)
        client._attach(Supervisor(StreamsTransport(receive_stream, send_stream), settings), pool_timeout)
        return client

    # ------------------------------------------------------------- properties

    @property
    def argv(self) -> list[str]:
        """The sidecar's command line (empty for a sidecar on a socket or given streams)."""
        return self._supervisor.transport.argv

    @argv.setter
    def argv(self, argv: list[str]) -> None:
        self._supervisor.transport.argv = argv

    @property
    def restarts(self) -> int:
        """Restarts so far (not counting the first start)."""
        return self._supervisor.restarts

    @property
    def info(self) -> SidecarInfo:
        """The facts of the current (or last) sidecar's ``ready`` frame."""
        info = self._supervisor.last_info
        if info is None:
            raise RuntimeError("the sidecar has not started yet")
        return info

    @property
    def url(self) -> Union[str, None]:
        """The address of the sidecar this client connects to, None when it spawns one."""
        address = self._supervisor.url
        return None if address is None else str(address)

    @property
    def pid(self) -> Union[int, None]:
        """Pid of the latest sidecar process (it may have exited), None before the first spawn."""
        return self._supervisor.last_pid

    @property
    def stderr_tail(self) -> str:
        """The last lines the latest sidecar wrote to stderr, redacted."""
        return self._supervisor.stderr_tail

    @property
    def closed(self) -> bool:
        return self._supervisor.closed

    @property
    def dead(self) -> bool:
        """Whether the restart budget is exhausted."""
        return self._supervisor.dead is not None

    @property
    def dead_reason(self) -> Union[RestartLimitError, None]:
        """Why the client is dead (what its next call raises), None while it is not."""
        return self._supervisor.dead

    @property
    def dead_since(self) -> Union[float, None]:
        """anyio clock time at which the client became dead, None while it is not."""
        return self._supervisor.dead_at

    async def revive(self) -> None:
        """Try once to bring a dead client back; raise the failure, staying dead, if it fails.

        The new sidecar counts in :attr:`restarts`, and on success the restart budget starts
        afresh.  Nothing happens when the client is not dead.
        """
        await self._supervisor.revive()

    # -------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Client:
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
        """Spawn the sidecar and wait for ``ready``; raises :class:`StartError` (or a subclass).

        The client's background tasks live in a root task of their own, not in the
        caller's task: :meth:`start` and :meth:`aclose` may be called at any nesting
        level, even from different tasks.  If :meth:`start` fails or is cancelled, the
        child is reaped and the client is as new.
        """
        await self._supervisor.start()

    async def aclose(self) -> None:
        """Stop the sidecar (bounded, shielded from cancellation) and close the client.  Idempotent.

        Pending requests end with :class:`RequestCancelledError` (``shutting_down``) or
        :class:`ClosedError`.  If the calling task is cancelled meanwhile, the cleanup
        still completes and the cancellation is raised afterwards.
        """
        await self._supervisor.aclose()

    async def restart(self) -> None:
        """Stop the current sidecar and start a new one, now; raises :class:`StartError` on failure.

        The old sidecar goes down the same ladder as in :meth:`aclose` (its pending requests
        end with ``shutting_down``).  An explicit restart waits for no backoff, does not
        count against ``max_restarts``, and revives a client that gave up (``dead``).
        """
        await self._supervisor.restart()

    def is_alive(self) -> bool:
        """Whether a sidecar is up and ready now: False before start, after a crash not yet
        followed by a call (which would restart it), when dead, and once closed."""
        return self._supervisor.is_alive()

    def __repr__(self) -> str:
        supervisor = self._supervisor
        return f"<Client {supervisor.state} pid={supervisor.last_pid} restarts={supervisor.restarts}>"

    # ------------------------------------------------------------- real time

    def stream_text(
        self,
        texts: TextInput,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
        lookahead: int = DEFAULT_LOOKAHEAD,
        max_sentence_chars: int = DEFAULT_MAX_SENTENCE_CHARS,
        text_format: TextFormat = "text",
        options: Union[Mapping[str, object], None] = None,
        **keywords: Any,
    ) -> TextStream:
        """Speak text as it is written (an LLM's tokens), sentence by sentence, in one audio stream.

        ``async with client.stream_text(fragments, voice=...) as chunks: async for chunk in chunks``
        yields :class:`~indextts_client.SentenceChunk` in order.  ``fragments`` is an (async)
        iterable of str split anywhere, with :data:`~indextts_client.FLUSH` to speak what is left
        (a plain iterable is read on the event loop: it must not block).  Each sentence is one
        streamed request, sent as soon as it is cut, up to ``lookahead`` sentences ahead of the one
        delivered; ``timeout``/``idle_timeout`` bound each.  Leaving the block cancels them all.
        Needs the ``[realtime]`` extra.  ``text_format="ssml"``: the fragments are one SSML text,
        cut only where no tag or element is open, each piece a ``<speak>`` document of its own.
        ``options`` and other keyword arguments: the engine's request options, as :meth:`stream`'s.
        See :mod:`indextts_client._stream_text`.
        """
        from ._stream_text import TextStream, client_session

        engine_options = merge_options(options, keywords)

        def open_sentence(text: str) -> ServedStream:
            return self.stream(
                text,
                voice=voice,
                emotion=emotion,
                sample_rate=sample_rate,
                timeout=timeout,
                idle_timeout=idle_timeout,
                text_format=text_format,
                options=engine_options,
            )

        return TextStream(
            client_session(open_sentence),
            texts,
            lookahead=lookahead,
            max_sentence_chars=max_sentence_chars,
            text_format=text_format,
        )

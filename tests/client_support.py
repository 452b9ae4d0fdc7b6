"""Shared helpers for the client tests (a module of helpers, not of tests).

Misbehaving children are tiny Python scripts run with ``python -c`` through the
client's ``command`` parameter, which replaces the ``python -m indextts_sidecar``
prefix; the engine arguments the client appends land in their ``sys.argv``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
from anyio.abc import SocketStream, TaskGroup

from indextts_client import Client
from indextts_sidecar import __version__, protocol
from indextts_sidecar._server import Server
from indextts_sidecar.engines.fake import FakeEngine, FakeOptions, render_bytes

PY = sys.executable

#: Small, fast audio: 8 kHz, 10 ms per character.
RATE = 8000
PER_CHAR = 0.01
FAKE_OPTIONS: dict[str, Any] = {"sample_rate": RATE, "seconds_per_char": PER_CHAR}


def expected(text: str, **kwargs: Any) -> bytes:
    """The exact bytes the fake engine (with FAKE_OPTIONS) produces for ``text``."""
    return render_bytes(text, RATE, seconds_per_char=PER_CHAR, **kwargs)


def fake_client(**kwargs: Any) -> Client:
    options = dict(FAKE_OPTIONS)
    options.update(kwargs.pop("engine_options", {}))
    kwargs.setdefault("restart_backoff", 0.0)
    kwargs.setdefault("shutdown_timeout", 2.0)
    kwargs.setdefault("sidecar_args", ["--log-level", "INFO"])
    return Client("fake", engine_options=options, **kwargs)


def script_client(script: str, **kwargs: Any) -> Client:
    kwargs.setdefault("restart_backoff", 0.0)
    return Client(command=[PY, "-c", script], **kwargs)


def assert_gone(pid: int | None) -> None:
    """The process no longer exists (reaped: not even a zombie)."""
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"process {pid} still exists")


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------ child scripts

_READY = (
    "import os, sys, msgspec\n"
    "def frame(obj):\n"
    "    body = msgspec.msgpack.encode(obj)\n"
    "    os.write(1, len(body).to_bytes(4, 'big') + body)\n"
    "def ready(protocol=1):\n"
    "    frame({'op': 'ready', 'protocol': protocol, 'version': '9.9', 'engine': 'script', 'pid': os.getpid(),\n"
    "           'max_frame_size': 65536})\n"
    "def read_frame():\n"
    "    head = b''\n"
    "    while len(head) < 4:\n"
    "        more = os.read(0, 4 - len(head))\n"
    "        if not more:\n"
    "            return None\n"
    "        head += more\n"
    "    size, body = int.from_bytes(head, 'big'), b''\n"
    "    while len(body) < size:\n"
    "        body += os.read(0, size - len(body))\n"
    "    return msgspec.msgpack.decode(body)\n"
)

#: Never sends ready; says so on stderr first (tests wait for that line).
NEVER_READY = "import sys, time\nsys.stderr.write('never-ready child waiting\\n')\nsys.stderr.flush()\ntime.sleep(60)\n"

#: Exits with code 5 before ready, with a last word on stderr.
EXIT_EARLY = "import sys\nsys.stderr.write('boom: the config is broken\\n')\nsys.exit(5)\n"

#: Speaks protocol 99.
VERSION_99 = _READY + "import time\nready(99)\ntime.sleep(60)\n"

#: Prints to its real stdout before ready.
GARBAGE_FIRST = "import sys, time\nprint('hello from a chatty library', flush=True)\ntime.sleep(60)\n"

#: Sends ready, then answers the first request with bytes that are not a frame.
GARBAGE_AFTER_READY = _READY + (
    "import time\nready()\nread_frame()\nos.write(1, b'\\x00\\x00\\x00\\x05hello world, not msgpack')\ntime.sleep(60)\n"
)

#: Sends ready, ignores SIGTERM, never answers shutdown and survives stdin EOF.
STUBBORN = (
    _READY + "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nready()\n"
    "while read_frame() is not None:\n    pass\ntime.sleep(60)\n"
)

#: Records its cwd and environment in $ENV_REPORT, then becomes the real sidecar.
ENV_REPORT = (
    "import json, os, sys\n"
    "with open(os.environ['ENV_REPORT'], 'w') as f:\n"
    "    json.dump({'cwd': os.getcwd(), 'env': dict(os.environ)}, f)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'indextts_sidecar', *sys.argv[1:]])\n"
)

#: Writes secrets to stderr, then exits before ready.
LEAKY = (
    "import os, sys\n"
    "sys.stderr.write('token ' + os.environ['MY_API_TOKEN'] + ' and hf_' + 'a1B2' * 9 + ' and '\n"
    "                 + os.environ['DB_PASSWORD'] + ' end\\n')\n"
    "sys.exit(3)\n"
)


# ------------------------------------------------------------------ helpers


class LineWatcher(logging.Handler):
    """Sets an event when a sidecar stderr line containing ``needle`` is logged."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.event = anyio.Event()
        self.callbacks: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.event.set()
            for callback in self.callbacks:
                callback()


@contextlib.contextmanager
def watch_stderr(needle: str) -> Iterator[LineWatcher]:
    logger = logging.getLogger("indextts_client.sidecar")
    handler = LineWatcher(needle)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


async def socket_pair() -> tuple[SocketStream, SocketStream]:
    left, right = socket.socketpair()
    return await SocketStream.from_socket(left), await SocketStream.from_socket(right)


def fake_ready(sample_rate: int = RATE, max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE) -> protocol.Ready:
    return protocol.Ready(
        protocol=protocol.PROTOCOL_VERSION,
        version=__version__,
        engine="fake",
        pid=os.getpid(),
        max_frame_size=max_frame_size,
        sample_rate=sample_rate,
        capabilities=list(FakeEngine.capabilities),
    )


@contextlib.asynccontextmanager
async def in_process_sidecar(tg: TaskGroup) -> AsyncIterator[SocketStream]:
    """A real Server with the fake engine on one end of a socket pair; yields the other end."""
    ours, theirs = await socket_pair()
    engine = FakeEngine(FakeOptions(sample_rate=RATE, seconds_per_char=PER_CHAR))
    server = Server(engine, frame_timeout=5.0)
    done = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve(theirs, theirs, ready=fake_ready())
        finally:
            done.set()

    tg.start_soon(serve)
    try:
        yield ours
    finally:
        with anyio.CancelScope(shield=True):
            await ours.aclose()
            with anyio.fail_after(5):
                await done.wait()

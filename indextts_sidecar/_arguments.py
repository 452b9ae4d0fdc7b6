"""The sidecar's command line: its options (``python -m indextts_sidecar --help``) and the
checks of their values that argparse's types cannot make.  ``_main.py`` runs what they ask."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, Union

from . import protocol
from ._defaults import (
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_MAX_OUTGOING,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_TEXT,
    DEFAULT_MAX_VOICE_BYTES,
)
from ._version import __version__
from .protocol.defaults import PARENT_ENV

__all__ = ["WIRE_NAMES", "check_arguments", "parser"]

#: The ``--wire`` names (see ``_main.wire_named``).
WIRE_NAMES = ("msgpack", "seed")


def parser() -> argparse.ArgumentParser:
    """The sidecar's command line (``python -m indextts_sidecar --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m indextts_sidecar",
        description="Serve a TTS engine over protocol v1 on stdin/stdout (docs/protocol.md in the source repository).",
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
        "one-file sidecar this project grew from, one request at a time (stdin/stdout only; docs/protocol.md in the "
        "source repository)",
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
        help=f"stop (as on SIGTERM) once process PID is gone; also {PARENT_ENV} (see docs/protocol.md in the source "
        "repository)",
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
    sockets = parser.add_argument_group("sockets (see docs/protocol.md in the source repository, 'Sockets')")
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
        help="print a JSON report on this venv (torch, GPUs, indextts, checkpoints) and exit; see docs/indextts.md "
        "in the source repository",
    )
    parser.add_argument("--model-dir", help="checkpoint directory for --doctor to check")


def check_arguments(args: Any) -> Union[tuple[str, str], None]:
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

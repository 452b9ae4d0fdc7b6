"""The sidecar's settings: every serving flag, read once from its command line into one frozen value
(a msgspec struct: msgspec is loaded already, before ``ready``).

:func:`~._main.main` parses the flags (:mod:`._arguments`), checks them, and builds one
:class:`SidecarFlags`; from there on nothing reads the parsed arguments again: the
server of each connection, the socket service, the voice store and the parent watch take
their values from it.
"""

from __future__ import annotations

import argparse
from typing import Union

import msgspec

from . import protocol

__all__ = ["SidecarFlags"]


class SidecarFlags(msgspec.Struct, frozen=True, kw_only=True):
    """What the flags of ``python -m indextts_sidecar`` asked for (``--help`` says what each means)."""

    engine: str
    #: ``-o KEY=VALUE``, in their order.
    options: tuple[str, ...]
    wire: str
    max_queue: int
    max_frame_size: int
    #: Seconds; 0 or less: no limit (see :attr:`frame_deadline`).
    frame_timeout: float
    max_text: int
    max_outgoing: int
    voice_dir: tuple[str, ...]
    max_voice_bytes: int
    parent_pid: Union[int, None]
    batch_wait_ms: float
    shared_audio_fd: Union[str, None]
    log_level: str
    # --listen and its companions
    listen: Union[str, None]
    token_file: Union[str, None]
    insecure: bool
    tls_cert: Union[str, None]
    tls_key: Union[str, None]
    max_connections: int
    max_handshakes: int
    handshake_timeout: float
    write_timeout: float
    max_voices: int
    max_voice_total_bytes: int
    max_voice_names: int
    max_voice_seconds: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SidecarFlags:
        """The settings of parsed (and checked) flags; an unset ``--engine`` is espeak, an unset
        ``--max-frame-size`` the wire's default."""
        max_frame_size = args.max_frame_size
        if max_frame_size is None:
            from ._seedwire import SEED_MAX_FRAME_SIZE

            max_frame_size = SEED_MAX_FRAME_SIZE if args.wire == "seed" else protocol.DEFAULT_MAX_FRAME_SIZE
        return cls(
            engine=args.engine or "espeak",
            options=tuple(args.option),
            wire=args.wire,
            max_queue=args.max_queue,
            max_frame_size=max_frame_size,
            frame_timeout=args.frame_timeout,
            max_text=args.max_text,
            max_outgoing=args.max_outgoing,
            voice_dir=tuple(args.voice_dir),
            max_voice_bytes=args.max_voice_bytes,
            parent_pid=args.parent_pid,
            batch_wait_ms=args.batch_wait_ms,
            shared_audio_fd=args.shared_audio_fd,
            log_level=args.log_level,
            listen=args.listen,
            token_file=args.token_file,
            insecure=args.insecure,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            max_connections=args.max_connections,
            max_handshakes=args.max_handshakes,
            handshake_timeout=args.handshake_timeout,
            write_timeout=args.write_timeout,
            max_voices=args.max_voices,
            max_voice_total_bytes=args.max_voice_total_bytes,
            max_voice_names=args.max_voice_names,
            max_voice_seconds=args.max_voice_seconds,
        )

    @property
    def frame_deadline(self) -> Union[float, None]:
        """``--frame-timeout`` as the reader takes it: None for no limit."""
        return self.frame_timeout if self.frame_timeout > 0 else None

    @property
    def batch_wait(self) -> float:
        """``--batch-wait-ms`` in seconds."""
        return self.batch_wait_ms / 1000

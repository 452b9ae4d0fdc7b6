"""The sidecar's edge: how frame bodies become requests and replies become frames.

The :class:`~._server.Server` speaks in :mod:`.protocol` messages; a :class:`Wire` turns a
frame body into a request and each reply into the bytes of a frame.  Every wire uses the
same framing (a 4-byte big-endian length, then the body; :mod:`.protocol.framing`), so only
the bodies differ.  Two wires exist: :class:`MsgpackWire`, protocol v1 (the default), and
:class:`~._seedwire.SeedWire`, the length-prefixed JSON of the one-file sidecar this
project grew from (``--wire seed``; docs/protocol.md, "The seed's wire").  ``_main``
picks one per connection by its ``--wire`` name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Union

import msgspec

from . import protocol

__all__ = ["FrameParts", "InvalidRequest", "MsgpackWire", "Wire"]

#: A frame as the outbox writes it: parts written back to back, the length prefix included.
FrameParts = Union[tuple[bytes], tuple[bytes, memoryview]]


class InvalidRequest(Exception):
    """A frame body that is no request; :attr:`error` is the answer (its ``id`` set if one was read)."""

    def __init__(self, error: protocol.Error) -> None:
        super().__init__(error.message)
        self.error = error


class Wire(Protocol):
    """One connection's message format.  ``encode`` and ``audio`` may be called from any thread."""

    #: Its ``--wire`` name.
    name: str
    #: True: the connection's next request is read only once the one before has its answer
    #: (a wire without request ids, whose replies are told apart by their order alone).
    one_at_a_time: bool

    def decode(self, body: memoryview) -> protocol.Request:
        """The request in ``body``; raises :class:`InvalidRequest`."""
        ...

    def encode(self, reply: protocol.Reply) -> Union[tuple[bytes], None]:
        """``reply`` as a frame, or None where this wire has no frame for it."""
        ...

    def audio(
        self, request_id: int, seq: int, sample_rate: int, pcm: memoryview, words: Sequence[protocol.WordSpan] = ()
    ) -> Union[FrameParts, None]:
        """An audio chunk as a frame, or None where the wire keeps it for the request's terminal frame.

        ``words``: the word timings that go with the chunk (``Audio.words``); a wire without
        a place for them drops them.
        """
        ...


class MsgpackWire:
    """Protocol v1: msgpack bodies (docs/protocol.md); audio goes out as it comes, samples uncopied."""

    name = "msgpack"
    one_at_a_time = False

    def decode(self, body: memoryview) -> protocol.Request:
        try:
            return protocol.decode_request(body)
        except (msgspec.MsgspecError, RecursionError) as exc:
            # RecursionError: nested deeper than msgspec can follow.
            raise InvalidRequest(protocol.describe_invalid(body, exc)) from None

    def encode(self, reply: protocol.Reply) -> tuple[bytes]:
        return (protocol.frame(reply),)

    def audio(
        self, request_id: int, seq: int, sample_rate: int, pcm: memoryview, words: Sequence[protocol.WordSpan] = ()
    ) -> tuple[bytes, memoryview]:
        return protocol.audio_frame_parts(request_id, seq, sample_rate, pcm, words)

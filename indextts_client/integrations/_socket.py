"""``serve``'s WebSocket route as a voice-agent service drives it (docs/serving.md, "/v1/audio/speech/stream").

Framework-free: the client events a service sends (the server's it reads are
:mod:`indextts_client._socket_events`), the binary frame's layout, and the one piece
of state a turn needs to place word timings on its own timeline (the route times each word from
its sentence's first sample; a framework wants them from the turn's first sample).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .._socket_events import AudioAlignment, AudioStart

__all__ = ["STREAM_PATH", "Timeline", "WordTime", "event", "split_frame", "stream_url"]

#: The route's path on ``indextts-client serve``.
STREAM_PATH = "/v1/audio/speech/stream"

#: (word, start, end): seconds from the turn's first sample.
WordTime = tuple[str, float, float]


def stream_url(base: str) -> str:
    """The route's URL from a server's URL: ``http``/``https`` become ``ws``/``wss``, and
    :data:`STREAM_PATH` is added to a URL that names no path (``http://host:8000``); a path
    it names (the route's own, or a proxy's) is kept."""
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"not an http(s) or ws(s) URL: {base!r}")
    path = parts.path if parts.path not in ("", "/") else STREAM_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def event(type: str, **fields: Any) -> str:
    """A client event as the route reads it; fields that are None are left out."""
    return json.dumps({"type": type, **{k: v for k, v in fields.items() if v is not None}})


def split_frame(message: bytes) -> tuple[str, bytes]:
    """A binary frame's ``(context_id, audio)``: one byte of length, the id in ASCII, the audio."""
    if not message:
        raise ValueError("an empty binary frame")
    n = message[0]
    if len(message) < 1 + n:
        raise ValueError("a binary frame shorter than its context id")
    return message[1 : 1 + n].decode("ascii"), message[1 + n :]


@dataclass
class Timeline:
    """One context's audio so far: where each sentence starts, in samples from the turn's first."""

    sample_rate: int = 0
    samples: int = 0  # received so far
    sentence_start: int = 0  # the current sentence's first sample

    def start_sentence(self, event: AudioStart) -> None:
        """At ``audio.start``."""
        self.sample_rate = event.sample_rate or self.sample_rate
        self.sentence_start = self.samples

    def add_audio(self, nbytes: int) -> None:
        """A binary frame of 16-bit pcm."""
        self.samples += nbytes // 2

    def words(self, event: AudioAlignment) -> list[WordTime]:
        """An ``audio.alignment``'s words on the turn's timeline.  Segment stand-ins (an engine
        without word timings) are split at spaces, every word of a segment at its start: the
        framework then holds a segment as heard once it began."""
        offset = self.sentence_start / self.sample_rate if self.sample_rate else 0.0
        out: list[WordTime] = []
        for word in event.words:
            text = word.word
            if not text:
                continue
            start, end = offset + word.start, offset + word.end
            if event.granularity == "segment":
                out.extend((part, start, end) for part in text.split())
            else:
                out.append((text, start, end))
        return out

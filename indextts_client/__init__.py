"""Drive a TTS sidecar (``python -m indextts_sidecar``) from async Python (asyncio or trio).

::

    from indextts_client import Client

    async with Client("espeak") as client:
        audio = await client.synthesize("Hello world")
        audio.to_file("hello.wav")

        async with client.stream("A longer text, streamed") as chunks:
            async for chunk in chunks:
                play(chunk.samples)

:class:`Client` spawns and supervises the sidecar; :class:`BlockingClient` is the same
without async, for scripts and notebooks; :class:`Connection` is the
transport-agnostic core for a sidecar reached over any anyio byte streams.  Every
error derives from :class:`SidecarError`.
"""

import logging

from indextts_sidecar import __version__
from indextts_sidecar.protocol import PROTOCOL_VERSION, EmotionAudio, EmotionText, EmotionVector

from ._audio import Audio, AudioChunk, TextSegment, WordTiming
from ._blocking import BlockingClient, BlockingStream, BlockingTextStream
from ._client import Client
from ._exceptions import (
    AuthenticationError,
    BufferFullError,
    BusyError,
    ClosedError,
    CrashedError,
    EngineError,
    InvalidRequestError,
    LoadFailedError,
    ProtocolError,
    RequestCancelledError,
    RequestTimeoutError,
    RestartLimitError,
    SidecarError,
    StartError,
    VersionMismatchError,
)
from ._pool._mps import MpsUnavailableError
from ._pool._pool import MemberHealth, Pool, PoolStream
from ._ssml import SsmlError
from ._stream_text import FLUSH, SentenceChunk, SentenceEnd, TextFeed, TextStream
from ._types import Health, LoadInfo, ProgressCallback, ProgressEvent, RestartCallback, SidecarInfo
from ._wire._connection import Connection
from ._wire._handshake import LossInfo
from ._wire._request import EmotionLike, Synthesis

__all__ = [
    "PROTOCOL_VERSION",
    "Audio",
    "AudioChunk",
    "AuthenticationError",
    "BlockingClient",
    "BlockingStream",
    "BlockingTextStream",
    "BufferFullError",
    "BusyError",
    "Client",
    "ClosedError",
    "Connection",
    "CrashedError",
    "EmotionAudio",
    "EmotionLike",
    "EmotionText",
    "EmotionVector",
    "EngineError",
    "FLUSH",
    "Health",
    "InvalidRequestError",
    "LoadFailedError",
    "LoadInfo",
    "LossInfo",
    "MemberHealth",
    "MpsUnavailableError",
    "Pool",
    "PoolStream",
    "ProgressCallback",
    "ProgressEvent",
    "ProtocolError",
    "RequestCancelledError",
    "RequestTimeoutError",
    "RestartCallback",
    "RestartLimitError",
    "SidecarError",
    "SentenceChunk",
    "SentenceEnd",
    "SidecarInfo",
    "SsmlError",
    "StartError",
    "Synthesis",
    "TextFeed",
    "TextSegment",
    "TextStream",
    "VersionMismatchError",
    "WordTiming",
    "__version__",
]

# A library logs; the application decides where that goes.  Without this, an application
# that never set up logging would see our warnings on stderr through logging's last resort.
logging.getLogger(__name__).addHandler(logging.NullHandler())

"""Every default of the sidecar's limits, said once: the command line and ``Server`` read them here.

A module of constants only, so that ``_main`` can build its parser before anything heavier is
imported (the ``ready`` frame goes out before the engine's imports).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_FRAME_TIMEOUT",
    "DEFAULT_MAX_OUTGOING",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_MAX_TEXT",
    "DEFAULT_MAX_VOICE_BYTES",
]

#: Requests waiting for the engine before another is refused ``busy`` (``--max-queue``).
DEFAULT_MAX_QUEUE: Final = 64
#: Seconds a started frame may take to arrive in full before framing counts as lost.
DEFAULT_FRAME_TIMEOUT: Final = 10.0
#: The longest request text, in characters; longer ones get ``invalid_input`` (``--max-text``).
DEFAULT_MAX_TEXT: Final = 100_000
#: Frames queued for the parent past which the reader stops reading requests (``--max-outgoing``).
DEFAULT_MAX_OUTGOING: Final = 1024
#: The largest voice or emotion reference file, named or registered (``--max-voice-bytes``).
DEFAULT_MAX_VOICE_BYTES: Final = 10 * 1024 * 1024

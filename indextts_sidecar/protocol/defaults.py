"""Names and values both sides of the wire must agree on, said once.

The client and the sidecar import these; nothing here imports anything heavy.
"""

from __future__ import annotations

__all__ = ["PARENT_ENV", "SHARED_AUDIO_FD_ENV", "STAGE_STARTED"]

#: The environment variable in which a client names its own pid, so that the sidecar stops
#: (as on SIGTERM) once that process is gone; the sidecar removes it from its environment.
PARENT_ENV = "INDEXTTS_SIDECAR_PARENT_PID"

#: The variable an older client used to pass a shared-memory descriptor; the sidecar only
#: closes what it names (audio always travels in frames).
SHARED_AUDIO_FD_ENV = "INDEXTTS_SIDECAR_SHARED_AUDIO_FD"

#: The ``progress`` stage a sidecar sends (to a request that asked for progress) the moment the
#: engine takes a ``synthesize`` request off the queue: the parent learns the queue wait before
#: the first audio, so that a streamed HTTP response can carry it in its headers.
STAGE_STARTED = "started"

"""Names and values both sides of the wire must agree on, said once.

The client and the sidecar import these; nothing here imports anything heavy.
"""

from __future__ import annotations

__all__ = ["PARENT_ENV", "SHARED_AUDIO_FD_ENV"]

#: The environment variable in which a client names its own pid, so that the sidecar stops
#: (as on SIGTERM) once that process is gone; the sidecar removes it from its environment.
PARENT_ENV = "INDEXTTS_SIDECAR_PARENT_PID"

#: The variable an older client used to pass a shared-memory descriptor; the sidecar only
#: closes what it names (audio always travels in frames).
SHARED_AUDIO_FD_ENV = "INDEXTTS_SIDECAR_SHARED_AUDIO_FD"

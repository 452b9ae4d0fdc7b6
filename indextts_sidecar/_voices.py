"""``register_voice`` and ``registered:NAME`` on the wire, over the shared :mod:`.voicestore`.

The store itself (bounds, persistence, sharing one directory between processes) is
:class:`~indextts_sidecar.voicestore.VoiceStore`; this maps its errors to the protocol's
``invalid_input`` with a ``$.``-field, and its answers to ``ok.info``.
"""

from __future__ import annotations

import os
from typing import Any

from .engines import EngineError, RequestError
from .protocol import REGISTERED_PREFIX
from .voicestore import SIDECAR_SUBDIR, VoiceLimits, VoiceNotFound, VoiceStore, VoiceStoreError

__all__ = ["STORE_DIR", "RegisteredVoices"]

#: Subdirectory of the first ``--voice-dir`` the store lives in (so the path policy admits its clips).
STORE_DIR = SIDECAR_SUBDIR


class RegisteredVoices:
    """The sidecar's view of the store under ``voice_dir``/:data:`STORE_DIR`."""

    def __init__(self, voice_dir: str, limits: VoiceLimits) -> None:
        self.store = VoiceStore(os.path.join(voice_dir, STORE_DIR), limits)

    def register(self, name: str, audio: bytes) -> dict[str, Any]:
        """Store ``audio`` under ``name`` (replacing an earlier clip of that name); return ``ok.info``."""
        try:
            info = self.store.add(name, audio, replace=True)
        except VoiceStoreError as exc:
            raise _request_error(exc) from None
        return {
            "name": name,
            "voice": REGISTERED_PREFIX + name,
            "id": info.id,
            "sha256": info.sha256,
            "bytes": info.bytes,
            "duration_s": info.duration_s,
            "sample_rate": info.sample_rate,
        }

    def resolve(self, value: str, field: str) -> str:
        """The stored file's path for ``registered:NAME`` (or ``registered:ID``)."""
        key = value[len(REGISTERED_PREFIX) :]
        try:
            return self.store.path(key)
        except VoiceNotFound:
            shown = key if len(key) <= 80 else key[:80] + "..."
            raise RequestError(f"no voice is registered as {shown!r} (register_voice)", field=field) from None
        except VoiceStoreError as exc:
            raise _request_error(exc) from None


def _request_error(exc: VoiceStoreError) -> EngineError:
    """``invalid_input`` for what the request got wrong; ``busy`` for a store locked too long; else ``internal``."""
    field = {"name": "$.name", "audio": "$.audio"}.get(exc.field or "")
    if exc.status < 500:
        return RequestError(exc.message, field=field)
    if exc.status == 503:
        error = EngineError(exc.message, code="busy")
        error.retryable = True
        return error
    return EngineError(exc.message, code="internal")

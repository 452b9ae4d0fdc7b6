"""Reference clips uploaded with ``register_voice``, stored by content hash.

A parent on another machine cannot name a file on the sidecar's disk, so it uploads the
clip instead.  The store keeps each distinct clip once, as ``<sha256><ext>`` in a
directory of its own under the first ``--voice-dir`` (so the path policy admits it),
bounded in bytes per clip and in clips overall; names map to clips in memory.  When
the store is full, the oldest clip that no name refers to any more makes room;
otherwise registering is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from typing import Any

from .engines import RequestError
from .protocol import REGISTERED_PREFIX

__all__ = ["DEFAULT_MAX_VOICES", "VoiceStore"]

DEFAULT_MAX_VOICES = 256
#: Subdirectory of the first ``--voice-dir`` the clips live in.
STORE_DIR = ".registered-voices"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: File name extensions by leading bytes, for engines that pick a decoder by extension.
_MAGIC = ((b"RIFF", ".wav"), (b"fLaC", ".flac"), (b"OggS", ".ogg"), (b"ID3", ".mp3"), (b"\xff\xfb", ".mp3"))


class VoiceStore:
    """Clips by content hash in ``directory``; names in memory.  Used on the event loop thread only."""

    def __init__(self, directory: str, *, max_bytes: int, max_count: int = DEFAULT_MAX_VOICES) -> None:
        self.directory = os.path.realpath(directory)
        self.max_bytes = max_bytes
        self.max_count = max_count
        self._names: dict[str, str] = {}

    def _files(self) -> list[str]:
        if not os.path.isdir(self.directory):
            return []
        return [name for name in os.listdir(self.directory) if not name.startswith(".")]

    def register(self, name: str, audio: bytes) -> dict[str, Any]:
        """Store ``audio`` under ``name`` (replacing an earlier clip of that name); return ``ok.info``."""
        if not _NAME.fullmatch(name):
            raise RequestError(
                f"voice name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                field="$.name",
            )
        if not audio:
            raise RequestError("the voice clip is empty", field="$.audio")
        if len(audio) > self.max_bytes:
            raise RequestError(
                f"the voice clip is {len(audio)} bytes, more than the limit of {self.max_bytes} (--max-voice-bytes)",
                field="$.audio",
            )
        digest = hashlib.sha256(audio).hexdigest()
        ext = next((e for magic, e in _MAGIC if audio.startswith(magic)), ".bin")
        filename = digest + ext
        path = os.path.join(self.directory, filename)
        if not os.path.exists(path):
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            self._make_room(replacing=name)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".upload-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(audio)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        self._names[name] = filename
        return {"name": name, "voice": REGISTERED_PREFIX + name, "sha256": digest, "bytes": len(audio)}

    def _make_room(self, replacing: str) -> None:
        files = self._files()
        if len(files) < self.max_count:
            return
        # The clip ``replacing`` names now is about to lose that name.
        used = {filename for name, filename in self._names.items() if name != replacing}
        unused = [f for f in files if f not in used]
        if not unused:
            raise RequestError(
                f"the voice store holds {len(files)} clips, its limit (--max-voices), all of them named",
                field="$.audio",
            )
        unused.sort(key=lambda f: os.stat(os.path.join(self.directory, f)).st_mtime)
        for filename in unused[: len(files) - self.max_count + 1]:
            os.unlink(os.path.join(self.directory, filename))

    def resolve(self, value: str, field: str) -> str:
        """The stored file's path for ``registered:NAME``."""
        name = value[len(REGISTERED_PREFIX) :]
        filename = self._names.get(name)
        if filename is None:
            raise RequestError(f"no voice is registered as {name!r} (register_voice)", field=field)
        return os.path.join(self.directory, filename)

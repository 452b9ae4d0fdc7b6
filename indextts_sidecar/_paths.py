"""The policy for files a request names (``voice``, an emotion reference ``path``).

A request can make an engine read any file it names.  Over a pipe that is the parent's
own authority, but a request should still never reach upstream with a directory, a FIFO
(which blocks the engine thread forever), a device, a ``/proc`` file or a 10 GB file;
and a sidecar that serves other parties must confine paths to directories it was given
(``--voice-dir``).  Checked on the event loop thread before the request is queued.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from ._defaults import DEFAULT_MAX_VOICE_BYTES
from .engines import RequestError

__all__ = ["DEFAULT_MAX_FILE_BYTES", "PathPolicy"]

#: Largest file a request may name (``--max-voice-bytes``): reference clips are seconds long.
DEFAULT_MAX_FILE_BYTES = DEFAULT_MAX_VOICE_BYTES
#: Pseudo-filesystems whose "regular files" are not data (``/proc/self/mem``...).
_SPECIAL_ROOTS = ("/proc", "/sys", "/dev")


class PathPolicy:
    """Refuses special files, directories, FIFOs, oversized files, and paths outside ``allowed_dirs``."""

    def __init__(self, allowed_dirs: Iterable[str] = (), max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.allowed_dirs = tuple(os.path.realpath(d) for d in allowed_dirs)
        self.max_bytes = max_bytes

    def _inside(self, real: str, directory: str) -> bool:
        return real == directory or real.startswith(directory.rstrip(os.sep) + os.sep)

    def check(self, path: str, field: str, what: str) -> None:
        """Raise :class:`RequestError` (``invalid_input``, naming ``field``) unless ``path`` may be read."""
        if not path or "\0" in path:
            raise RequestError(f"{what} path {path!r} is empty or holds a NUL byte", field=field)
        real = os.path.realpath(path)  # symlinks and '..' resolved: the file that would be opened
        if self.allowed_dirs and not any(self._inside(real, d) for d in self.allowed_dirs):
            raise RequestError(f"{what} {path!r} is outside the allowed directories (--voice-dir)", field=field)
        if any(self._inside(real, root) for root in _SPECIAL_ROOTS):
            raise RequestError(f"{what} {path!r} is a special file, not audio", field=field)
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise RequestError(f"{what} {path!r} does not exist", field=field) from None
        except OSError as exc:
            raise RequestError(f"{what} {path!r} cannot be read: {exc.strerror}", field=field) from None
        if stat.S_ISDIR(info.st_mode):
            raise RequestError(f"{what} {path!r} is a directory", field=field)
        if not stat.S_ISREG(info.st_mode):
            raise RequestError(f"{what} {path!r} is not a regular file (a FIFO, device or socket)", field=field)
        if info.st_size > self.max_bytes:
            raise RequestError(
                f"{what} {path!r} is {info.st_size} bytes, more than the limit of {self.max_bytes} (--max-voice-bytes)",
                field=field,
            )
        if not os.access(real, os.R_OK):
            raise RequestError(f"{what} {path!r} is not readable", field=field)

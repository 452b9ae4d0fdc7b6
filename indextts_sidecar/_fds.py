"""Taking the frame pipes over from fds 0 and 1, before anything can print.

The pipes the parent gave us move to private descriptors: fd 0 then reads
``/dev/null`` and fd 1 points at stderr.  A library that prints, from Python or from C,
writes to stderr and cannot corrupt the frame stream, and a grandchild process
inherits neither pipe.  This module imports only the standard library: it runs before
``ready`` is sent.
"""

from __future__ import annotations

import fcntl
import os
import sys

__all__ = ["take_over_stdio"]

_PIPE_SIZE = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def take_over_stdio() -> tuple[int, int]:
    """Move the frame pipes off fds 0 and 1; return the private (read, write) fds.

    Raises OSError (EBADF) when fd 0 or 1 is closed, before a new descriptor could take its number.
    """
    os.fstat(0)
    os.fstat(1)
    if sys.stdout is not None:
        sys.stdout.flush()
    read_fd = os.dup(0)
    write_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    if sys.platform == "linux":
        try:  # bigger pipe: fewer wake-ups per MiB of audio; best effort
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass
    return read_fd, write_fd

"""How ``python -m indextts_sidecar`` ends: its exit hooks run, its modules are not torn down.

Python's finalisation frees every module and what it holds, one object at a time.  With torch,
transformers and upstream loaded that took about 2 s of CPU on the 2-core VM, more than the
client waits before it terminates the sidecar: every close of an IndexTTS sidecar ended in
SIGTERM.  By then the answers are written and the threads joined, so the teardown buys nothing.

``__main__`` imports this module first thing, which registers :func:`_leave` before anything
else can register an exit hook.  atexit runs its hooks last registered first, so every other
hook (logging's flush, ``weakref.finalize``'s clean-ups of temporary files, an engine's own)
runs before it; Python has joined the threads that are not daemons before any hook runs.
:func:`_leave` then flushes the standard streams and ends the process with the status
:func:`finished` was given.  Where ``main`` raised instead, it does nothing: Python exits as
usual, traceback and all.
"""

from __future__ import annotations

import atexit
import os
import sys

_status: list[int] = []


def finished(status: int) -> int:
    """Record the status ``main`` returned, for :func:`_leave`; returns it."""
    _status.append(status)
    return status


def _leave() -> None:
    if not _status:
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the descriptor closed
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone
            pass
    os._exit(_status[-1])


atexit.register(_leave)

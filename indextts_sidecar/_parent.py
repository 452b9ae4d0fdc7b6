"""What stops a sidecar from outside: SIGTERM or SIGINT, and the end of the process that started it.

The parent watch is a pid watch, not ``PR_SET_PDEATHSIG`` (which fires when the spawning
*thread* exits).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import anyio
from anyio.abc import TaskStatus

__all__ = ["stop_on_signal", "stop_without_parent"]

log = logging.getLogger("indextts_sidecar")

#: Seconds between two looks at the parent process.
_PARENT_POLL = 0.5


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie has exited: its parent has not reaped it yet
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"
    except OSError:
        return False


async def stop_without_parent(server: Any, pid: int) -> None:
    """Stop once process ``pid`` is gone, even if a process it forked keeps our pipes open."""
    # Our own parent: its end shows as a new parent id (no pid reuse can fool that).
    direct = os.getppid() == pid
    while True:
        await anyio.sleep(_PARENT_POLL)
        if os.getppid() != pid if direct else _process_gone(pid):
            break
    log.warning("parent process %d is gone; stopping", pid)
    server.stop()


async def stop_on_signal(server: Any, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Stop ``server`` at each SIGTERM or SIGINT; started (``TaskGroup.start``) once they are caught."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            log.info("received signal %d; stopping", signum)
            server.stop()

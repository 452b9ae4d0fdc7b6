"""A task outside the caller's cancel scopes, on either event loop.

The supervisor's root task (which owns the sidecar sessions) and the pool's healer must
outlive the call that started them: cancelling that caller, or leaving its task group, must
not cancel them.  anyio has no such task, so this starts a trio system task under trio and
a plain asyncio task under asyncio, holding a strong reference to the latter (asyncio keeps
only weak ones) until it ends.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["spawn_detached"]

_asyncio_roots: set[asyncio.Task[None]] = set()


def spawn_detached(fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
    """Run ``fn`` in a task outside the caller's scopes: a trio system task or an asyncio task."""
    if "trio" in sys.modules:
        import trio

        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            trio.lowlevel.spawn_system_task(fn, name=name)
            return
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(fn(), name=name)
    _asyncio_roots.add(task)
    task.add_done_callback(_asyncio_roots.discard)

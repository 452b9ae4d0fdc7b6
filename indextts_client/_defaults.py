"""Every default of the client's settings, said once.

``Client``, ``Connection``, ``Pool`` and the facades that forward to them take their
defaults from here, so that a default cannot drift between them.
"""

from __future__ import annotations

from typing import Final, Union

__all__ = [
    "DEFAULT_FRAME_TIMEOUT",
    "DEFAULT_HEARTBEAT_MISSES",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BUFFERED",
    "DEFAULT_MAX_OUTSTANDING",
    "DEFAULT_MAX_RESTARTS",
    "DEFAULT_MAX_RESTART_BACKOFF",
    "DEFAULT_MAX_REVIVE_AFTER",
    "DEFAULT_MAX_SILENCE",
    "DEFAULT_PER_DEVICE",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_READY_TIMEOUT",
    "DEFAULT_RESTART_BACKOFF",
    "DEFAULT_RESTART_WINDOW",
    "DEFAULT_SHUTDOWN_TIMEOUT",
]

#: Seconds an SSML text's breaks may add up to (``max_silence``; a server's ``--max-silence``).
DEFAULT_MAX_SILENCE: Final = 60.0
#: Seconds to wait for the sidecar's ``ready`` frame (the handshake, before any heavy import).
DEFAULT_READY_TIMEOUT: Final[Union[float, None]] = 30.0
#: Seconds the sidecar gets to exit after ``shutdown`` before it is terminated, then killed.
DEFAULT_SHUTDOWN_TIMEOUT: Final = 2.0
#: Seconds a request may go without any frame (progress or audio) before it fails.
DEFAULT_IDLE_TIMEOUT: Final[Union[float, None]] = 300.0
#: Seconds one frame may take to be written before the connection counts as stalled.
DEFAULT_FRAME_TIMEOUT: Final[Union[float, None]] = 10.0
#: Audio bytes one request may hold unconsumed before it fails with BufferFullError.
DEFAULT_MAX_BUFFERED: Final = 64 * 1024 * 1024
#: Restarts allowed within DEFAULT_RESTART_WINDOW seconds before the client is dead.
DEFAULT_MAX_RESTARTS: Final = 3
DEFAULT_RESTART_WINDOW: Final = 60.0
#: The first restart's delay, doubled on each further one up to the maximum.
DEFAULT_RESTART_BACKOFF: Final = 0.5
DEFAULT_MAX_RESTART_BACKOFF: Final = 10.0
#: Missed heartbeats in a row after which the sidecar counts as hung.
DEFAULT_HEARTBEAT_MISSES: Final = 3

# A pool's (Pool's keywords, and serve's and wyoming's options, _pool/_cli.py).
#: Sidecars a pool spawns when given neither size nor devices (nor only urls).
DEFAULT_POOL_SIZE: Final = 1
#: Sidecars on each of the devices.
DEFAULT_PER_DEVICE: Final = 1
#: Requests in flight on one member before the next waits for room.
DEFAULT_MAX_OUTSTANDING: Final = 4
#: Seconds a request waits for room on a pool's members (None: no bound).
DEFAULT_POOL_TIMEOUT: Final[Union[float, None]] = 30.0
#: The longest pause between tries to revive a dead member, in seconds.
DEFAULT_MAX_REVIVE_AFTER: Final = 600.0

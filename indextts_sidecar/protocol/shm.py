"""An optional shared-memory ring for audio samples, beside the frame pipe.

A parent that spawns the sidecar on the same machine may pass it a shared memory file
(a Linux ``memfd``) with ``--shared-audio-fd`` or the environment variable
``INDEXTTS_SIDECAR_SHARED_AUDIO_FD``.  The sidecar then copies large audio
chunks into the ring and sends an ``audio`` frame that names the ring position instead
of carrying the bytes: one copy in, one copy out, and the pipe carries only small
frames, where otherwise the kernel copies every byte through the pipe buffer, with the
writer and the reader taking turns on it.  The parent offers the ring only on x86-64,
whose memory model keeps the release store below behind the copy before it.

Layout: 64 header bytes, then the ring.  Header bytes 0-7 hold the consumer's
position: a little-endian unsigned count of ring bytes released so far, written only by
the parent.  Positions are monotonic byte counts; the ring offset of position ``p`` is
``p % capacity``.  A region never wraps: when the next one does not fit before the end
of the ring, the producer skips to the start, and the consumer releasing a region
releases whatever was skipped before it.  The producer writes a region only when it is
wholly free (``start + size - released <= capacity``), else it sends the samples in the
frame as usual.  Regions are released in order, since frames arrive in order.
"""

from __future__ import annotations

import mmap
import os
from typing import Union

__all__ = ["HEADER_SIZE", "SHARED_AUDIO_ENV", "AudioRing", "RingError", "create_shared_memory"]

HEADER_SIZE = 64
#: How a spawning parent names the inherited descriptor (``--shared-audio-fd`` does the same).
SHARED_AUDIO_ENV = "INDEXTTS_SIDECAR_SHARED_AUDIO_FD"


class RingError(ValueError):
    """A frame names a region the ring cannot hold: the peer broke the ring's rules."""


class AudioRing:
    """One side of the ring over the shared memory file ``fd`` (the ring keeps its own mapping)."""

    def __init__(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size <= HEADER_SIZE:
            raise ValueError(f"shared audio memory of {size} bytes is too small")
        self._map = mmap.mmap(fd, size)
        self._view = memoryview(self._map)
        self._released = self._view[0:8].cast("Q")
        self.capacity = size - HEADER_SIZE
        #: Producer side: the position after the last region written.
        self.head = 0

    @property
    def released(self) -> int:
        """The consumer's position: every region before it may be reused."""
        return int(self._released[0])

    # ------------------------------------------------------------ producer

    def write(self, data: memoryview) -> Union[int, None]:
        """Copy ``data`` into the ring; its position, or None when it does not fit now."""
        size = len(data)
        capacity = self.capacity
        if not 0 < size <= capacity:
            return None
        start = self.head
        if start % capacity + size > capacity:
            start += capacity - start % capacity  # skip to the ring's start
        if start + size - self.released > capacity:
            return None
        offset = HEADER_SIZE + start % capacity
        self._view[offset : offset + size] = data
        self.head = start + size
        return start

    # ------------------------------------------------------------ consumer

    def _region(self, position: int, size: int) -> int:
        capacity = self.capacity
        if size <= 0 or size > capacity or position < self.released or position % capacity + size > capacity:
            raise RingError(
                f"shared audio region at {position}+{size} is outside the free ring "
                f"(released up to {self.released}, capacity {capacity})"
            )
        return HEADER_SIZE + position % capacity

    def read_into(self, position: int, size: int, destination: memoryview) -> None:
        """Copy the region into ``destination``, then release it (and anything skipped before it)."""
        offset = self._region(position, size)
        destination[:size] = self._view[offset : offset + size]
        self._forget(offset, size)
        # An aligned 8-byte store, after the copy in program order; the producer reads it
        # only to decide whether a region is free, so a stale value only wastes a chance.
        self._released[0] = position + size

    def _forget(self, offset: int, size: int) -> None:
        """Drop the region's whole pages from this process's resident set (the data stays shared).

        Otherwise every page of the ring the consumer ever read would count in its RSS.
        """
        first = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (offset + size) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def release(self, position: int, size: int) -> None:
        """Release the region unread (its request is gone)."""
        self._region(position, size)
        self._released[0] = position + size

    def close(self) -> None:
        self._released.release()
        self._view.release()
        self._map.close()


def create_shared_memory(size: int) -> int:
    """A new anonymous shared memory file of ``size`` bytes (Linux); the caller owns the fd."""
    fd = os.memfd_create("indextts-audio", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd

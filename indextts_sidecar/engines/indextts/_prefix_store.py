"""The voice prefix cache's store: least recently used items, bounded in entries and bytes.

Pure bookkeeping (no torch): :mod:`._prefix` puts in it what a voice's GPT prefix costs to
compute (its emotion vector, its speaker conditioning latents, the GPT's keys and values over
its conditioning positions), each under a key of the exact inputs it was computed from, with
its size in bytes.  Items are of a few kinds; each kind keeps at most ``entries`` items (one
per voice prefix), and all of them together at most ``max_bytes``: the least recently used
item goes first, of its kind when a kind is full, of any kind when the bytes are.  Used on
the engine thread (and a batch's threads, one at a time); counters are read from the event
loop thread, plain ints.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = ["KINDS", "NOT_LOADED", "PrefixStore", "PrefixTally"]

#: What a voice's prefix is made of, in the order upstream computes it: the emotion vector
#: (``merge_emovec``), the speaker's conditioning latents (``get_conditioning``), and the
#: GPT's keys and values over the conditioning positions (``kv``: what ``health`` counts).
KINDS = ("emotion", "conditioning", "kv")

#: :attr:`PrefixStore.problem` before a load and after an unload.
NOT_LOADED = "no model is loaded"


@dataclass
class PrefixTally:
    """One request's use of the cache (its ``done.facts["prefix_cache"]``)."""

    hits: int = 0
    misses: int = 0
    #: Seconds of GPT prefill: the emotion vector, the conditioning and the first forward pass.
    prefill: float = 0.0

    def facts(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "prefill_s": round(self.prefill, 4)}


@dataclass
class _Item:
    kind: str
    value: Any
    size: int


@dataclass
class PrefixStore:
    """Items by key, least recently used first; ``entries`` or ``max_bytes`` 0 keeps nothing."""

    entries: int
    max_bytes: int
    _items: OrderedDict[Hashable, _Item] = field(default_factory=OrderedDict, repr=False)
    bytes: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    evictions: int = 0
    #: Items held per kind, kept as plain ints: ``health`` reads them from another thread.
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    #: The current request's tally (the adapter starts one per lone request).
    tally: PrefixTally = field(default_factory=PrefixTally)
    #: Why the cache does not run (no model loaded, an unknown upstream); None when it does.
    problem: Union[str, None] = NOT_LOADED

    def __post_init__(self) -> None:
        if self.entries < 0 or self.max_bytes < 0:
            raise ValueError("prefix cache bounds must be 0 or more")

    @property
    def enabled(self) -> bool:
        return self.entries > 0 and self.max_bytes > 0

    def get(self, kind: str, key: Hashable) -> Any:
        """The item of ``kind`` under ``key``, now the most recently used; None if absent."""
        if not self.enabled:
            return None
        item = self._items.get((kind, key))
        if item is None:
            self.misses[kind] += 1
            if kind == "kv":
                self.tally.misses += 1
            return None
        self._items.move_to_end((kind, key))
        self.hits[kind] += 1
        if kind == "kv":
            self.tally.hits += 1
        return item.value

    def put(self, kind: str, key: Hashable, value: Any, size: int) -> bool:
        """Keep ``value`` (``size`` bytes); False when it alone is over the byte bound (or disabled)."""
        if kind not in KINDS:
            raise ValueError(f"unknown prefix cache kind {kind!r}")
        if not self.enabled or size > self.max_bytes:
            return False
        old = self._items.pop((kind, key), None)
        if old is not None:
            self.bytes -= old.size
            self.counts[kind] -= 1
        self._items[(kind, key)] = _Item(kind, value, size)
        self.bytes += size
        self.counts[kind] += 1
        while self.counts[kind] > self.entries:
            self._evict(kind)
        while self.bytes > self.max_bytes:
            self._evict(None)
        return True

    def _evict(self, kind: Any) -> None:
        for key, item in self._items.items():
            if kind is None or item.kind == kind:
                del self._items[key]
                self.bytes -= item.size
                self.counts[item.kind] -= 1
                self.evictions += 1
                return

    def clear(self, problem: Union[str, None] = NOT_LOADED) -> None:
        """Drop every item (a load or an unload: the keys hold for one model only)."""
        self.problem = problem
        self._items.clear()
        self.bytes = 0
        self.counts = dict.fromkeys(KINDS, 0)

    def start(self) -> PrefixTally:
        """A fresh tally for the next request."""
        self.tally = PrefixTally()
        return self.tally

    def health(self) -> dict[str, int]:
        """What ``health`` (``pong.memory``) reports: bytes held, prefixes held, their hits and misses;
        nothing while the cache does not run (off, no model loaded, an unknown upstream)."""
        if not self.enabled or self.problem is not None:
            return {}
        return {
            "prefix_cache_bytes": self.bytes,
            "prefix_cache_entries": self.counts["kv"],
            "prefix_cache_hits": self.hits["kv"],
            "prefix_cache_misses": self.misses["kv"],
        }

    def stats(self) -> dict[str, Any]:
        """Bounds, bytes and per-kind entries, hits and misses (``load``'s info)."""
        return {
            "entries": self.entries,
            "max_bytes": self.max_bytes,
            "bytes": self.bytes,
            "evictions": self.evictions,
            "problem": self.problem,
            "kinds": {
                kind: {"entries": self.counts[kind], "hits": self.hits[kind], "misses": self.misses[kind]}
                for kind in KINDS
            },
        }

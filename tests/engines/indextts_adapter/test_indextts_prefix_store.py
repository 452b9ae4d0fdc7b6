"""The voice prefix cache's store (engines/indextts/_prefix_store.py): LRU order, the entry and byte
bounds, 0 as off, the counters health reports; and the engine options that set its bounds.

The cache against the real upstream code (identical greedy codes warm and cold) is
tests/upstream/test_prefix_cache.py.
"""

from __future__ import annotations

import msgspec
import pytest

from indextts_sidecar.engines.indextts import IndexTTS2Options, IndexTTS25Options
from indextts_sidecar.engines.indextts._options import PREFIX_CACHE_BYTES_DEFAULT, PREFIX_CACHE_DEFAULT
from indextts_sidecar.engines.indextts._prefix_store import NOT_LOADED, PrefixStore


def running(entries: int, max_bytes: int) -> PrefixStore:
    store = PrefixStore(entries, max_bytes)
    store.clear(problem=None)  # as after a load whose GPT took the wrappers
    return store


def test_a_kind_keeps_its_most_recently_used_entries() -> None:
    store = running(2, 10_000)
    store.put("kv", "a", "A", 10)
    store.put("kv", "b", "B", 10)
    assert store.get("kv", "a") == "A"  # now the most recent: b goes first
    store.put("kv", "c", "C", 10)
    assert store.get("kv", "b") is None
    assert (store.get("kv", "a"), store.get("kv", "c")) == ("A", "C")
    assert store.counts["kv"] == 2 and store.bytes == 20 and store.evictions == 1
    # Each kind has its own entries: an emotion vector does not push out a prefix.
    store.put("emotion", "a", "E", 1)
    assert store.counts == {"emotion": 1, "conditioning": 0, "kv": 2}


def test_the_byte_bound_evicts_the_least_recent_item_of_any_kind() -> None:
    store = running(8, 100)
    store.put("emotion", "e", "E", 30)
    store.put("kv", "a", "A", 40)
    store.put("kv", "b", "B", 40)  # 110 bytes: the emotion vector, least recent, goes
    assert store.get("emotion", "e") is None and store.bytes == 80
    assert store.put("kv", "big", "X", 101) is False  # alone over the bound: never kept
    assert store.get("kv", "big") is None and store.bytes == 80
    store.put("kv", "a", "A2", 60)  # replacing an item counts its new size only
    assert store.get("kv", "a") == "A2" and store.bytes == 100 and store.counts["kv"] == 2
    store.put("kv", "c", "C", 30)  # b, now the least recent, goes
    assert store.get("kv", "b") is None and store.bytes == 90 and store.counts["kv"] == 2


@pytest.mark.parametrize(("entries", "max_bytes"), [(0, 1000), (4, 0)])
def test_zero_turns_it_off(entries: int, max_bytes: int) -> None:
    store = running(entries, max_bytes)
    assert not store.enabled
    assert store.put("kv", "a", "A", 1) is False
    assert store.get("kv", "a") is None
    assert store.health() == {} and store.bytes == 0 and store.misses["kv"] == 0


def test_health_and_the_request_tally() -> None:
    store = PrefixStore(4, 1000)
    assert store.problem == NOT_LOADED and store.health() == {}  # nothing before a load
    store.clear(problem=None)
    tally = store.start()
    assert store.get("kv", "a") is None
    store.put("kv", "a", "A", 7)
    assert store.get("kv", "a") == "A"
    tally.prefill += 0.25
    assert tally.facts() == {"hits": 1, "misses": 1, "prefill_s": 0.25}
    assert store.health() == {
        "prefix_cache_bytes": 7,
        "prefix_cache_entries": 1,
        "prefix_cache_hits": 1,
        "prefix_cache_misses": 1,
    }
    assert store.start().facts() == {"hits": 0, "misses": 0, "prefill_s": 0.0}
    stats = store.stats()
    assert stats["kinds"]["kv"] == {"entries": 1, "hits": 1, "misses": 1} and stats["max_bytes"] == 1000
    store.clear()  # an unload: the keys hold for one model only
    assert store.bytes == 0 and store.counts["kv"] == 0 and store.health() == {}
    with pytest.raises(ValueError, match="kind"):
        store.put("latent", "a", "A", 1)


def test_the_engine_options() -> None:
    defaults = msgspec.convert({}, IndexTTS2Options)
    assert (defaults.prefix_cache, defaults.prefix_cache_bytes) == (PREFIX_CACHE_DEFAULT, PREFIX_CACHE_BYTES_DEFAULT)
    assert msgspec.convert({"prefix_cache": "0"}, IndexTTS25Options, strict=False).prefix_cache == 0
    for bad in ({"prefix_cache": -1}, {"prefix_cache_bytes": -5}, {"prefix_cache": "many"}):
        with pytest.raises(msgspec.ValidationError, match="prefix_cache"):
            msgspec.convert(bad, IndexTTS2Options, strict=False)
    with pytest.raises(ValueError, match="0 or more"):
        PrefixStore(-1, 10)

"""The voice prefix cache (issue 42, docs/indextts.md "Voice prefix cache") against the real upstream
code on the tiny fixtures, 2 and 2.5: ``probe_prefix.py`` drives the adapter in upstream's venv, and
the tests here judge what it recorded.

Greedy decoding (a seed, upstream's three beams and one beam): a request that reuses its voice's
prefix decodes the same codes as one that computed it, and as one with the cache off, and its
audio is the same int16 samples; a batch reuses its voices' prefixes and decodes what each does
alone.  ``prefix_cache=1`` evicts the least recently used voice; a byte bound below one voice's keys
and values keeps none of them; 0 keeps nothing and reports nothing; ``health`` (``memory()``)
counts entries, bytes, hits and misses.  The bounds' own logic is unit-tested in the main suite
(tests/engines/indextts_adapter/test_indextts_prefix_store.py).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from conftest import HERE, flavour_named
from test_profile import run_probe

#: The probe loads the tiny model once and runs fourteen short requests.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=["2", "2.5"])
def report(request: pytest.FixtureRequest, checkpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    name = request.param
    ckpt = checkpoints(flavour_named(name))
    out = tmp_path_factory.mktemp(f"prefix-{name}")
    done: subprocess.CompletedProcess[str] = run_probe(
        name, ckpt, str(HERE / "probe_prefix.py"), name, str(ckpt), str(out)
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


#: How far two runs of one request's first logits may drift apart (float rounding; measured: 1.5e-6).
NOISE = 1e-5


def spread(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference between two requests' first logits."""
    return max(abs(x - y) for x, y in zip(a["logits"], b["logits"], strict=True))


def prefix(health: dict[str, int]) -> tuple[int, int, int]:
    return health["prefix_cache_entries"], health["prefix_cache_hits"], health["prefix_cache_misses"]


def test_a_warm_request_decodes_what_a_cold_one_does(report: Any) -> None:
    off, on = report["off"], report["on"]
    # The same request twice, then another text at one beam: cache off, and cache on (cold, warm, warm).
    for cold, warm in zip(off, on[:3], strict=True):
        assert warm["codes"] == cold["codes"] and len(cold["codes"][0]) == 8
        assert warm["samples"] == cold["samples"] and len(cold["samples"]) > 0
    # The checks above can fail: another text, or another voice, reaches the GPT's logits.  (Not its
    # codes: a tiny random 2.5's argmax hardly hears the text, and one machine's eight codes for two
    # texts were the same.)  Warm and cold differ by float rounding, about 1e-6; text and voice by
    # 0.01-0.5 on the tiny fixtures.
    assert spread(off[0], on[0]) < NOISE and spread(on[0], on[1]) < NOISE and spread(off[2], on[2]) < NOISE
    assert spread(off[0], off[2]) > 100 * NOISE and spread(on[0], on[3]) > 100 * NOISE
    # The first computes the prefix, the next two reuse it.
    assert [r["facts"]["prefix_cache"]["hits"] for r in on[:3]] == [0, 1, 1]
    assert [r["facts"]["prefix_cache"]["misses"] for r in on[:3]] == [1, 0, 0]
    assert all(r["facts"]["prefix_cache"]["prefill_s"] > 0 for r in on)
    assert [prefix(r["health"]) for r in on] == [(1, 0, 1), (1, 1, 1), (1, 2, 1), (2, 2, 2)]
    assert on[0]["health"]["prefix_cache_bytes"] > 0
    assert on[3]["health"]["prefix_cache_bytes"] == 2 * on[0]["health"]["prefix_cache_bytes"]


def test_upstream_still_has_the_calls_it_wraps(report: Any) -> None:
    # An upstream that renamed them would load with the cache off, its reason here: fail loudly.
    assert report["on_info"]["problem"] is None and report["off_info"]["problem"] is None


def test_a_batch_reuses_its_voices_prefixes(report: Any) -> None:
    batch, on = report["on_batch"], report["on"]
    # Voice 1's request and voice 2's, both kept: both rows hit and decode what each did alone.
    assert batch["codes"] == [on[0]["codes"][0], on[3]["codes"][0]]
    assert prefix(batch["health"]) == (2, 4, 2)


def test_off_keeps_nothing_and_reports_nothing(report: Any) -> None:
    for r in report["off"]:
        assert not any(name.startswith("prefix_cache") for name in r["health"])
        assert r["facts"]["prefix_cache"]["hits"] == r["facts"]["prefix_cache"]["misses"] == 0
    assert report["off_info"]["entries"] == 0 and report["off_info"]["bytes"] == 0
    assert not any(name.startswith("prefix_cache") for name in report["unloaded"])


def test_the_entry_bound_evicts_the_least_recent_voice(report: Any) -> None:
    first, second, again = report["bounded"]
    assert again["codes"] == first["codes"]  # recomputed after its eviction, the same
    assert [prefix(r["health"]) for r in (first, second, again)] == [(1, 0, 1), (1, 0, 2), (1, 0, 3)]
    assert report["bounded_info"]["kinds"]["kv"]["entries"] == 1 and report["bounded_info"]["evictions"] > 0


def test_the_byte_bound_keeps_no_item_over_it(report: Any) -> None:
    cold, warm = report["bytes"]
    assert warm["codes"] == cold["codes"]
    assert prefix(warm["health"]) == (0, 0, 2)  # one voice's keys and values are over 4096 bytes
    assert 0 <= warm["health"]["prefix_cache_bytes"] <= 4096
    assert report["bytes_info"]["max_bytes"] == 4096


def test_an_engine_loads_with_the_speedups_on(report: Any) -> None:
    """The default load (this probe's engine) puts the same-output speed-ups on (test_gpt_fast.py)."""
    assert report["speedups"] == {
        "gpt_speedups": {"packed_linear": "on", "beam_cache": "on"},
        "s2mel_speedups": {"tail_crop": "on", "last_layer_crop": "on", "mask_skip": "on", "weight_norm_once": "on"},
    }

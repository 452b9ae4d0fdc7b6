"""Living with upstream in-process: its imports, its prints (engines/indextts/_upstream.py).

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from indextts_support import loaded_engine

from indextts_sidecar.engines.indextts import IndexTTS25Engine
from indextts_sidecar.engines.indextts._upstream import StageTimes, openmp_waits


def test_importing_upstream_leaves_the_process_as_it_was(
    ckpt25: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Upstream's modules install warning filters and (2.5) point HF_HUB_CACHE at ./checkpoints.
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    standin("v25")
    filters = list(warnings.filters)
    loaded_engine(IndexTTS25Engine, ckpt25)
    (imported,) = [c for c in calls() if c["event"] == "imported"]
    assert imported["module"] == "indextts.infer_v2_5" and imported["hf_hub_cache"] == "./checkpoints/hf_cache"
    assert "HF_HUB_CACHE" not in os.environ
    assert warnings.filters == filters


def test_stage_times_are_read_from_upstreams_stdout_which_still_gets_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = io.StringIO()
    monkeypatch.setattr(sys, "stdout", real)
    times = StageTimes()
    with times.capturing():
        print(">> gpt_gen_time: 1.25 seconds")
        with times.capturing():  # nested: no loop of the stream onto itself
            print(">> s2mel_", end="")  # a line in two writes
            print("time: 0.50 seconds")
        kept = sys.stdout
        print(">> Total inference time: 9.00 seconds")
    assert sys.stdout is real
    kept.write(">> bigvgan_time: 2 seconds\nafter\n")  # a reference kept past the capture still writes through
    assert times.stages == {"gpt_gen": 1.25, "s2mel": 0.5, "bigvgan": 2.0}
    assert real.getvalue() == (
        ">> gpt_gen_time: 1.25 seconds\n>> s2mel_time: 0.50 seconds\n>> Total inference time: 9.00 seconds\n"
        ">> bigvgan_time: 2 seconds\nafter\n"
    )
    times.write("x" * 10_000)  # a line without its end is kept bounded
    assert len(times._partial) <= 256


def test_openmp_threads_spin_briefly_unless_the_user_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set before torch loads libgomp: its idle threads spin 1,000 times, not 300,000, then sleep.
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert openmp_waits() == {"GOMP_SPINCOUNT": "1000"} and os.environ["GOMP_SPINCOUNT"] == "1000"
    # A user's own setting wins, whichever of the two it is.
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert openmp_waits() == {"OMP_WAIT_POLICY": "ACTIVE"} and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "50000")
    assert openmp_waits() == {"GOMP_SPINCOUNT": "50000"}
    # Once torch is imported, libgomp has read its environment: nothing is set that would not count.
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setitem(sys.modules, "torch", object())
    assert openmp_waits() == {} and "GOMP_SPINCOUNT" not in os.environ

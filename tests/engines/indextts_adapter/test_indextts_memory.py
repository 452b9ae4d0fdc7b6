"""memory() and unload(): torch is never imported, caches are freed (engines/indextts/_adapter.py, _upstream.py).

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from indextts_support import ignore_progress, loaded_engine, make_engine, make_request, never, speak

from indextts_sidecar.engines.indextts import IndexTTS2Engine

# ----------------------------------------------------------------- memory and unload


def _fake_torch(cuda: bool = False, mps: bool = False, log: list[str] | None = None) -> Any:
    events = log if log is not None else []
    cuda_ns = types.SimpleNamespace(
        is_available=lambda: cuda,
        is_initialized=lambda: cuda,
        memory_allocated=lambda: 1000,
        memory_reserved=lambda: 2000,
        empty_cache=lambda: events.append("cuda.empty_cache"),
    )
    mps_ns = types.SimpleNamespace(
        current_allocated_memory=lambda: 300,
        driver_allocated_memory=lambda: 400,
        empty_cache=lambda: events.append("mps.empty_cache"),
    )
    backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps))
    return types.SimpleNamespace(cuda=cuda_ns, mps=mps_ns, backends=backends)


def test_memory_never_imports_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    engine = make_engine(IndexTTS2Engine)
    assert engine.memory() == {}
    assert "torch" not in sys.modules


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [
        (True, False, {"cuda_allocated": 1000, "cuda_reserved": 2000}),
        (False, True, {"mps_allocated": 300, "mps_driver": 400}),
        (False, False, {}),
    ],
)
def test_memory_reports_the_accelerator(
    cuda: bool, mps: bool, expected: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda=cuda, mps=mps))
    assert make_engine(IndexTTS2Engine).memory() == expected


def test_memory_survives_a_half_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())  # as seen mid-import
    assert make_engine(IndexTTS2Engine).memory() == {}


def test_unload_frees_the_model_and_the_cuda_cache(
    ckpt: Path,
    voice: str,
    standin: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    standin("v2")
    engine = loaded_engine(IndexTTS2Engine, ckpt)
    events: list[str] = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda=True, log=events))
    engine.unload()
    assert not engine.loaded and events == ["cuda.empty_cache"]
    engine.unload()  # idempotent
    assert events == ["cuda.empty_cache"]
    engine.load(ignore_progress, never)
    assert len([c for c in calls() if c["event"] == "__init__"]) == 2
    assert speak(engine, make_request(IndexTTS2Engine, voice))

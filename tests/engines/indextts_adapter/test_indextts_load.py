"""The adapter's load(): steps, constructor keywords, dropped options (engines/indextts/_adapter.py).

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import make_checkpoints
from indextts_support import ignore_progress, make_engine, never, upstream_aux_paths

from indextts_sidecar.engines import Cancelled, LoadError
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, IndexTTSAuto, _adapter

# ----------------------------------------------------------------- load


def test_load_reports_each_step_and_heartbeats_while_constructing(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    gate = tmp_path / "construct-gate"
    monkeypatch.setenv("INDEXTTS_STANDIN_CONSTRUCT_GATE", str(gate))
    monkeypatch.setattr(_adapter, "HEARTBEAT_INTERVAL", 0.01)
    events: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def progress(*args: Any) -> None:
        with lock:
            events.append(args)
            # The constructor blocks until three heartbeats have arrived.
            if sum(1 for e in events if e[1] == 0.3) >= 4:
                gate.touch()

    engine = make_engine(IndexTTS2Engine, model_dir=str(ckpt))
    engine.load(progress, never)
    assert engine.loaded and engine.flavour.kind == "2"
    fractions = [e[1] for e in events]
    assert fractions[:3] == [0.0, 0.1, 0.3] and fractions[-1] == 1.0
    assert fractions.count(0.3) >= 4, "heartbeats during the construct step"
    assert all(e[0] == "load" for e in events)
    assert "IndexTTS-2" in events[-1][2]


def test_load_cancelled_between_steps(ckpt: Path, standin: Callable[[str], None]) -> None:
    standin("v2")
    engine = make_engine(IndexTTS2Engine, model_dir=str(ckpt))
    with pytest.raises(Cancelled):
        engine.load(ignore_progress, lambda: True)
    assert not engine.loaded


def test_constructor_gets_keywords_only_mapped_from_options(
    ckpt: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v2")
    engine = make_engine(
        IndexTTS2Engine,
        model_dir=str(ckpt),
        device="cpu",
        fp16=True,
        use_cuda_kernel=False,
        use_deepspeed=True,
        use_accel=True,
        use_torch_compile=True,
        use_qwen_emo=False,
    )
    engine.load(ignore_progress, never)
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    assert init["args"] == []
    assert init["kwargs"] == {
        "model_dir": str(ckpt),
        "cfg_path": str(ckpt / "config.yaml"),
        "device": "cpu",
        "use_fp16": True,
        "use_cuda_kernel": False,
        "use_deepspeed": True,
        "use_accel": True,
        "use_torch_compile": True,
        "use_qwen_emo": False,
        "aux_paths": upstream_aux_paths(ckpt),
    }
    assert engine.dropped_options == []


def test_auxiliary_models_stay_offline_unless_downloads_are_allowed(
    ckpt: Path,
    tmp_path: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    standin("v2")
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    make_engine(IndexTTS2Engine, model_dir=str(ckpt)).load(ignore_progress, never)
    bare = make_checkpoints(tmp_path / "bare", hf_cache=False)
    with pytest.raises(LoadError, match="allow_download=true"):
        make_engine(IndexTTS2Engine, model_dir=str(bare)).load(ignore_progress, never)
    # With downloads allowed upstream gets no aux_paths and fetches what is missing (the
    # stand-in, without network, fails there), and the Hugging Face libraries are left online.
    with pytest.raises(RuntimeError, match=r"would download w2v-bert-2\.0/"):
        make_engine(IndexTTS2Engine, model_dir=str(bare), allow_download=True).load(ignore_progress, never)
    inits = [c for c in calls() if c["event"] == "__init__"]
    assert [init["kwargs"].get("aux_paths") for init in inits] == [upstream_aux_paths(ckpt), None]
    (constructed,) = [c for c in calls() if c["event"] == "constructed"]
    assert constructed["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    (download,) = [c for c in calls() if c["event"] == "download"]
    assert download["env"] == {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}
    assert not any(name in os.environ for name in names), "restored after construction"


def test_unset_options_keep_upstream_defaults(
    ckpt25: Path, tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    cfg = tmp_path / "config_v2_5.yaml"
    cfg.write_text("version: 2.5\n")
    make_engine(IndexTTS25Engine, model_dir=str(ckpt25), cfg_path=str(cfg), bf16=True).load(ignore_progress, never)
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    # Upstream 2.5 has no aux_paths: it reads <model_dir>/hf_cache itself.
    assert init["kwargs"] == {"model_dir": str(ckpt25), "cfg_path": str(cfg), "use_bf16": True}


def test_the_other_25_constructor_signature(
    ckpt25: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One upstream commit defaults cfg_path to configs/config_v2_5.yaml and adds use_gpt_latent.
    monkeypatch.setenv("INDEXTTS_STANDIN_V25_VARIANT", "gpt_latent")
    standin("v25")
    make_engine(IndexTTS25Engine, model_dir=str(ckpt25), use_cuda_kernel=True).load(ignore_progress, never)
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    assert init["args"] == []
    expected = {"model_dir": str(ckpt25), "cfg_path": str(ckpt25 / "config.yaml"), "use_cuda_kernel": True}
    assert init["kwargs"] == expected


@pytest.mark.parametrize(
    ("flavour", "version", "cls", "options", "dropped", "passed"),
    [
        # indextts2-inference 2.1.1 has use_accel but no use_qwen_emo (it always loads the model).
        (
            "pypi",
            "2",
            IndexTTS2Engine,
            {"use_accel": True, "use_qwen_emo": False, "fp16": True},
            ["use_qwen_emo"],
            {"use_fp16": True, "use_accel": True},
        ),
        ("v25", "2.5", IndexTTSAuto, {"fp16": True, "bf16": True}, ["fp16"], {"use_bf16": True}),
        ("v2", "2", IndexTTSAuto, {"fp16": True, "bf16": False, "lang": "zh"}, ["bf16", "lang"], {"use_fp16": True}),
        # Upstream turns fp16 off on MPS only when it picks the device itself.
        ("v2", "2", IndexTTS2Engine, {"device": "mps", "fp16": True}, ["fp16"], {"device": "mps"}),
    ],
)
def test_options_the_installed_constructor_lacks_are_dropped(
    flavour: str,
    version: str,
    cls: type[Any],
    options: dict[str, Any],
    dropped: list[str],
    passed: dict[str, Any],
    tmp_path: Path,
    standin: Callable[[str], None],
    calls: Callable[[], list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    standin(flavour)
    ckpt = make_checkpoints(tmp_path / "ckpt", version=version)
    engine = make_engine(cls, model_dir=str(ckpt), **options)
    engine.load(ignore_progress, never)
    assert engine.dropped_options == dropped
    (init,) = [c for c in calls() if c["event"] == "__init__"]
    assert init["args"] == []
    if flavour == "v2":
        passed = {**passed, "aux_paths": upstream_aux_paths(ckpt)}
    assert init["kwargs"] == {"model_dir": str(ckpt), "cfg_path": str(ckpt / "config.yaml"), **passed}
    for name in dropped:
        assert any(name in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    # A reload starts from a clean list.
    engine.unload()
    engine.load(ignore_progress, never)
    assert engine.dropped_options == dropped


def test_a_failed_construct_leaves_the_engine_unloaded_and_retryable(
    ckpt: Path, tmp_path: Path, standin: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("v2")
    monkeypatch.setenv("INDEXTTS_STANDIN_FAIL_CONSTRUCTS", "1")
    monkeypatch.setenv("INDEXTTS_STANDIN_COUNTER", str(tmp_path / "count"))
    engine = make_engine(IndexTTS2Engine, model_dir=str(ckpt))
    with pytest.raises(RuntimeError, match="injected construct failure 1 of 1"):
        engine.load(ignore_progress, never)
    assert not engine.loaded
    engine.load(ignore_progress, never)
    assert engine.loaded

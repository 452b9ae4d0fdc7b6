"""The package's import cost and the built-in engine names (engines/indextts/__init__.py)."""

from __future__ import annotations

import subprocess
import sys

from harness import REPO
from indextts_support import make_engine

from indextts_sidecar.engines import engine_class
from indextts_sidecar.engines.indextts import IndexTTS2Engine, IndexTTS25Engine, IndexTTSAuto

# ----------------------------------------------------------------- import and registry


def test_module_imports_only_stdlib_and_msgspec() -> None:
    code = (
        "import sys; import indextts_sidecar.engines.indextts; "
        "heavy = {'numpy', 'torch', 'indextts', 'anyio', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_engines_are_registered_with_the_native_rate() -> None:
    assert engine_class("indextts2") is IndexTTS2Engine
    assert engine_class("indextts2.5") is IndexTTS25Engine
    assert engine_class("indextts") is IndexTTSAuto
    for cls in (IndexTTS2Engine, IndexTTS25Engine, IndexTTSAuto):
        engine = make_engine(cls)
        assert engine.sample_rate == cls.native_sample_rate == 22050
        assert not engine.loaded
        assert "streaming" in cls.capabilities

"""Checkpoint files and flavours (engines/indextts/_install.py), and what load says of them.

They call the adapter in-process against the stand-in packages in tests/standin; the
wire-level tests, with a real sidecar child, are in test_indextts_sidecar.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import STANDIN, make_checkpoints
from indextts_support import ignore_progress, loaded_engine, make_engine, never

from indextts_sidecar.engines import LoadError
from indextts_sidecar.engines import indextts as adapter
from indextts_sidecar.engines.indextts import (
    AUX_FILES,
    AUX_FILES_25,
    CHECKPOINT_FILES,
    CHECKPOINT_FILES_25,
    IndexTTS2Engine,
    IndexTTS25Engine,
    IndexTTSAuto,
    find_flavour,
    missing_checkpoints,
)

ALL_ENTRIES = [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/"]
ALL_ENTRIES_25 = [*CHECKPOINT_FILES_25, "qwen0.6bemo4-merge/"]


# ----------------------------------------------------------------- checkpoints and flavours


def test_missing_checkpoints_lists_every_entry(tmp_path: Path) -> None:
    assert missing_checkpoints(str(tmp_path / "absent")) == ALL_ENTRIES
    assert missing_checkpoints(str(tmp_path / "absent"), qwen_emo=False) == list(CHECKPOINT_FILES)
    assert missing_checkpoints(str(tmp_path / "absent"), version="2.5") == ALL_ENTRIES_25
    assert missing_checkpoints(str(tmp_path / "absent"), qwen_emo=False, aux=True) == [*CHECKPOINT_FILES, *AUX_FILES]
    partial = make_checkpoints(tmp_path / "partial", skip=("gpt.pth", "feat2.pt", "qwen0.6bemo4-merge/"))
    assert missing_checkpoints(str(partial)) == ["gpt.pth", "feat2.pt", "qwen0.6bemo4-merge/"]
    cfg = str(tmp_path / "elsewhere.yaml")
    assert missing_checkpoints(str(partial), cfg_path=cfg, qwen_emo=False) == [cfg, "gpt.pth", "feat2.pt"]
    # 2.5 reads codec.pth and its tiktoken tokenizer, never bpe.model nor MaskGCT's codec.
    two5 = make_checkpoints(tmp_path / "two5", version="2.5", skip=("codec.pth", "hf_cache/bigvgan/config.json"))
    assert not (two5 / "bpe.model").exists() and not (two5 / "hf_cache/semantic_codec_model.safetensors").exists()
    assert missing_checkpoints(str(two5), version="2.5", aux=True) == ["codec.pth", "hf_cache/bigvgan/config.json"]
    assert missing_checkpoints(str(two5), version="2", qwen_emo=False) == ["bpe.model"]


def test_the_checkpoint_directory_decides_the_version(tmp_path: Path) -> None:
    assert adapter.checkpoint_version(str(make_checkpoints(tmp_path / "a"))) == "2"
    assert adapter.checkpoint_version(str(make_checkpoints(tmp_path / "b", version="2.5"))) == "2.5"
    assert adapter.checkpoint_version(str(tmp_path / "absent")) is None
    # Without a version line, the files only one version has decide.
    for name, version in (("codec.pth", "2.5"), (adapter.TIKTOKEN_FILE, "2.5"), ("bpe.model", "2")):
        folder = tmp_path / f"files-{name}"
        folder.mkdir()
        (folder / "config.yaml").write_text("gpt:\n  layers: 1\n")
        (folder / name).write_bytes(b"stand-in")
        assert adapter.checkpoint_version(str(folder)) == version
    # The version line wins over the files, and cfg_path replaces <model_dir>/config.yaml.
    mixed = make_checkpoints(tmp_path / "mixed")
    (mixed / "codec.pth").write_bytes(b"stand-in")
    assert adapter.checkpoint_version(str(mixed)) == "2"
    cfg = tmp_path / "v25.yaml"
    cfg.write_text('version: "2.5"  # quoted, with a comment\n')
    assert adapter.checkpoint_version(str(mixed), str(cfg)) == "2.5"


@pytest.mark.parametrize(
    ("cls", "options", "expect"),
    [
        (IndexTTS2Engine, {}, [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/", *AUX_FILES]),
        (IndexTTS2Engine, {"use_qwen_emo": False}, [*CHECKPOINT_FILES, *AUX_FILES]),
        (IndexTTS2Engine, {"use_qwen_emo": False, "allow_download": True}, list(CHECKPOINT_FILES)),
        (IndexTTS25Engine, {}, [*CHECKPOINT_FILES_25, *AUX_FILES_25]),
        (IndexTTS25Engine, {"use_qwen_emo": True}, [*CHECKPOINT_FILES_25, "qwen0.6bemo4-merge/", *AUX_FILES_25]),
        (IndexTTSAuto, {}, [*CHECKPOINT_FILES, "qwen0.6bemo4-merge/", *AUX_FILES]),
    ],
)
def test_load_reports_every_missing_file_before_importing(
    cls: type[Any], options: dict[str, Any], expect: list[str], tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v25")
    empty = tmp_path / "empty"
    empty.mkdir()
    engine = make_engine(cls, model_dir=str(empty), **options)
    with pytest.raises(LoadError) as info:
        engine.load(ignore_progress, never)
    message = str(info.value)
    assert f"missing {', '.join(expect)}" in message, message
    assert ("allow_download=true" in message) == any(name.startswith("hf_cache/") for name in expect)
    assert str(empty) in message and "is incomplete" in message
    assert info.value.code == "load_failed" and info.value.retryable and info.value.field == "model_dir"
    assert "indextts.infer_v2" not in sys.modules, "checkpoints are checked before the import"
    assert "indextts.infer_v2_5" not in sys.modules
    with pytest.raises(LoadError, match="does not exist"):
        make_engine(cls, model_dir=str(tmp_path / "nowhere")).load(ignore_progress, never)


def test_a_missing_qwen_folder_is_reported_with_the_rest(tmp_path: Path, standin: Callable[[str], None]) -> None:
    standin("v2")
    partial = make_checkpoints(
        tmp_path / "partial", skip=("feat1.pt", "qwen0.6bemo4-merge/", "hf_cache/bigvgan/config.json")
    )
    with pytest.raises(LoadError) as info:
        make_engine(IndexTTS2Engine, model_dir=str(partial)).load(ignore_progress, never)
    assert "missing feat1.pt, qwen0.6bemo4-merge/, hf_cache/bigvgan/config.json (" in str(info.value)
    assert "use_qwen_emo is on" in str(info.value)
    assert "indextts.infer_v2" not in sys.modules


def test_a_version_the_engine_does_not_run_names_the_other_engine(
    tmp_path: Path, standin: Callable[[str], None]
) -> None:
    standin("v25")  # a checkout holds the code of both versions: the directory decides
    ckpt2, ckpt25 = make_checkpoints(tmp_path / "two"), make_checkpoints(tmp_path / "two5", version="2.5")
    for cls, ckpt, version, other in (
        (IndexTTS25Engine, ckpt2, "2", "indextts2"),
        (IndexTTS2Engine, ckpt25, "2.5", "indextts2.5"),
    ):
        with pytest.raises(LoadError) as info:
            make_engine(cls, model_dir=str(ckpt)).load(ignore_progress, never)
        assert (info.value.code, info.value.field) == ("load_failed", "model_dir")
        assert f"holds an IndexTTS-{version} model" in str(info.value)
        assert f"--engine {other}" in str(info.value) and "--engine indextts" in str(info.value)
    assert "indextts.infer_v2" not in sys.modules and "indextts.infer_v2_5" not in sys.modules


def test_auto_follows_the_directory(
    tmp_path: Path, standin: Callable[[str], None], calls: Callable[[], list[dict[str, Any]]]
) -> None:
    standin("v25")
    two = loaded_engine(IndexTTSAuto, make_checkpoints(tmp_path / "two"))
    two5 = loaded_engine(IndexTTSAuto, make_checkpoints(tmp_path / "two5", version="2.5"))
    assert (two.flavour.kind, two.flavour.module) == ("2", "indextts.infer_v2")
    assert (two5.flavour.kind, two5.flavour.module) == ("2.5", "indextts.infer_v2_5")
    assert two.info()["model_version"] == "2" and two5.info()["model_version"] == "2.5"
    assert [c["module"] for c in calls() if c["event"] == "__init__"] == ["indextts.infer_v2", "indextts.infer_v2_5"]


def test_load_without_indextts_says_how_to_install(ckpt: Path, standin: Callable[[str], None]) -> None:
    with pytest.raises(LoadError, match="IndexTTS is not installed in this interpreter") as info:
        make_engine(IndexTTSAuto, model_dir=str(ckpt)).load(ignore_progress, never)
    assert sys.executable in str(info.value) and "--doctor" in str(info.value)


def test_a_25_directory_on_a_2_install_says_what_is_missing(tmp_path: Path, standin: Callable[[str], None]) -> None:
    standin("v2")
    ckpt25 = make_checkpoints(tmp_path / "two5", version="2.5")
    for cls in (IndexTTS25Engine, IndexTTSAuto):
        with pytest.raises(LoadError) as info:
            make_engine(cls, model_dir=str(ckpt25)).load(ignore_progress, never)
        message = str(info.value)
        assert (
            "holds an IndexTTS-2.5 model, and no indextts.infer_v2_5 or indextts25.infer_v2_5 is installed" in message
        )
        assert "(it has IndexTTS-2, which cannot run this checkpoint)" in message


@pytest.mark.parametrize(
    ("flavour", "prefer", "kind", "module"),
    [
        ("v2", ("2.5", "2"), "2", "indextts.infer_v2"),
        ("v25", ("2.5", "2"), "2.5", "indextts.infer_v2_5"),
        ("v25", ("2",), "2", "indextts.infer_v2"),
        ("pypi", ("2.5", "2"), "pypi", "indextts.infer_v2"),
    ],
)
def test_find_flavour(
    flavour: str, prefer: tuple[str, ...], kind: str, module: str, standin: Callable[[str], None]
) -> None:
    assert find_flavour() is None
    standin(flavour)
    found = find_flavour(prefer)
    assert found is not None and (found.kind, found.module) == (kind, module)
    assert found.location == str(STANDIN / flavour / "indextts")
    # Not even the package: the PyPI packages' __init__ imports the model, and torch with it,
    # which must come after the sidecar bounds OpenMP's spinning (_upstream.openmp_waits).
    assert not {"indextts", "indextts.infer_v2", "indextts.infer_v2_5"} & set(sys.modules)

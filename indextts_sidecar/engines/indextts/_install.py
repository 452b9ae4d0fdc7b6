"""What an IndexTTS installation is made of: the flavours of upstream code, the checkpoint files.

Shared by the adapter, which refuses to load what is missing, and by the doctor, which
reports it.  Imports only the standard library: finding a flavour looks for modules in
their packages' folders and imports neither the package nor the module holding the model.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

__all__ = [
    "AUX_FILES",
    "AUX_FILES_25",
    "CHECKPOINT_FILES",
    "CHECKPOINT_FILES_25",
    "FLAVOUR_MODULES",
    "PYPI25_DISTRIBUTION",
    "PYPI_DISTRIBUTION",
    "QWEN_EMO_DIR",
    "TIKTOKEN_FILE",
    "Flavour",
    "aux_paths",
    "checkpoint_version",
    "find_flavour",
    "import_hint",
    "installation_problem",
    "missing_checkpoints",
    "package_dir",
]

#: Files an IndexTTS-2 checkpoint directory must hold (``glossary.yaml`` is optional).
CHECKPOINT_FILES = ("config.yaml", "bpe.model", "gpt.pth", "s2mel.pth", "wav2vec2bert_stats.pt", "feat1.pt", "feat2.pt")
#: 2.5's text tokenizer (read by ``indextts/utils/tokenizer.py``); 2.5 never reads ``bpe.model``.
TIKTOKEN_FILE = "multilingual_zh_ja_yue_char_del.tiktoken"
#: Files an IndexTTS-2.5 checkpoint directory must hold.
CHECKPOINT_FILES_25 = (
    "config.yaml",
    "gpt.pth",
    "codec.pth",
    "s2mel.pth",
    "wav2vec2bert_stats.pt",
    "feat1.pt",
    "feat2.pt",
    TIKTOKEN_FILE,
)
#: Auxiliary models upstream reads from ``<model_dir>/hf_cache`` (and downloads when absent).
AUX_FILES = (
    "hf_cache/w2v-bert-2.0/config.json",
    "hf_cache/w2v-bert-2.0/preprocessor_config.json",
    "hf_cache/w2v-bert-2.0/model.safetensors",
    "hf_cache/semantic_codec_model.safetensors",
    "hf_cache/campplus_cn_common.bin",
    "hf_cache/bigvgan/config.json",
    "hf_cache/bigvgan/bigvgan_generator.pt",
)
#: 2.5 has its own semantic codec (``codec.pth``) and never reads MaskGCT's.
AUX_FILES_25 = tuple(name for name in AUX_FILES if "semantic_codec" not in name)
#: The Qwen emotion model, needed only when ``use_qwen_emo`` is on (emotion from text).
QWEN_EMO_DIR = "qwen0.6bemo4-merge"
#: The distribution names of the PyPI repackagings.
PYPI_DISTRIBUTION = "indextts2-inference"
PYPI25_DISTRIBUTION = "indextts25-inference"


@dataclass(frozen=True)
class Flavour:
    """Which upstream code runs: ``kind`` is ``"2"``, ``"2.5"`` (the GitHub checkout), ``"pypi"``
    (``indextts2-inference``) or ``"pypi2.5"`` (``indextts25-inference``)."""

    kind: str
    #: The module holding ``IndexTTS2``.
    module: str
    #: Where the package lives.
    location: Union[str, None]

    @property
    def label(self) -> str:
        return {
            "2": "IndexTTS-2",
            "2.5": "IndexTTS-2.5",
            "pypi": f"IndexTTS-2 from {PYPI_DISTRIBUTION}",
            "pypi2.5": f"IndexTTS-2.5 from {PYPI25_DISTRIBUTION}",
        }[self.kind]

    @property
    def version(self) -> str:
        """The model version it runs: ``"2"`` or ``"2.5"``."""
        return "2.5" if self.kind in ("2.5", "pypi2.5") else "2"

    @property
    def engine(self) -> str:
        return "indextts2.5" if self.version == "2.5" else "indextts2"

    @property
    def unit_scale(self) -> bool:
        """Streamed chunks are floats in [-1, 1] rather than on PCM scale."""
        return self.kind == "pypi"

    @property
    def silence_after_each(self) -> bool:
        """The stream follows every segment with a silence, the last one too (all but ``indextts25``)."""
        return self.kind != "pypi2.5"

    @property
    def streams_with_generator(self) -> bool:
        """Stream through ``infer_generator``: ``indextts25``'s ``infer`` returns the first segment only."""
        return self.kind == "pypi2.5"

    @property
    def qwen_emo_default(self) -> bool:
        """Whether the constructor loads the Qwen emotion model unless told otherwise."""
        return self.kind in ("2", "pypi")

    @property
    def local_aux(self) -> bool:
        """Auxiliary models come from ``<model_dir>/hf_cache`` (2.1.1 reads the Hugging Face cache)."""
        return self.kind != "pypi"


#: Model version -> the modules that run it, in order of preference, with their flavour kind.
FLAVOUR_MODULES = {
    "2": (("indextts.infer_v2", "2"),),
    "2.5": (("indextts.infer_v2_5", "2.5"), ("indextts25.infer_v2_5", "pypi2.5")),
}


def package_dir(package: str = "indextts") -> Union[str, None]:
    """The directory of ``package`` if it is installed (imports nothing)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return locations[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _is_pypi(location: Union[str, None]) -> bool:
    """Whether ``indextts2-inference`` is installed and owns the ``indextts`` found on the path."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PYPI_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    if location is None:
        return True
    try:
        owned = str(dist.locate_file("indextts"))
        return bool(os.path.realpath(owned) == os.path.realpath(location))
    except (OSError, TypeError, NotImplementedError):
        return True


def find_flavour(prefer: Iterable[str] = ("2.5", "2")) -> Union[Flavour, None]:
    """The first installed flavour for the model versions in ``prefer``, importing nothing.

    The model's module is looked up in its package's folder, never through the package: the
    PyPI packages' ``__init__`` imports the model, and with it torch, which must come after
    ``openmp_waits`` (and costs seconds).  Returns None when none of ``prefer`` is installed.
    """
    for version in prefer:
        for module, kind in FLAVOUR_MODULES[version]:
            package = module.partition(".")[0]
            location = package_dir(package)
            if location is None or importlib.machinery.PathFinder.find_spec(module, [location]) is None:
                continue
            if kind == "2" and _is_pypi(location):
                kind = "pypi"
            return Flavour(kind=kind, module=module, location=location)
    return None


_VERSION_LINE = re.compile(r"""^version:\s*["']?(\d+(?:\.\d+)?)["']?\s*(?:#.*)?$""", re.MULTILINE)


def checkpoint_version(model_dir: str, cfg_path: Union[str, None] = None) -> Union[str, None]:
    """The model version a checkpoint directory holds: ``"2"``, ``"2.5"``, or None if unknown.

    Decided by the config's ``version`` (upstream writes ``2.0`` or ``2.5``), else by the
    files only one version has (2.5: ``codec.pth`` and its tiktoken file; 2: ``bpe.model``).
    A checkout holds the code of both, so the directory, not the code, decides.
    """
    config = cfg_path if cfg_path is not None else os.path.join(model_dir, "config.yaml")
    try:
        with open(config, encoding="utf-8", errors="replace") as f:
            match = _VERSION_LINE.search(f.read(1 << 20))
    except OSError:
        match = None
    if match is not None:
        number = float(match.group(1))
        if number >= 2.5:
            return "2.5"
        if number >= 2.0:
            return "2"
    if any(os.path.isfile(os.path.join(model_dir, name)) for name in ("codec.pth", TIKTOKEN_FILE)):
        return "2.5"
    if os.path.isfile(os.path.join(model_dir, "bpe.model")):
        return "2"
    return None


def missing_checkpoints(
    model_dir: str,
    *,
    cfg_path: Union[str, None] = None,
    qwen_emo: bool = True,
    version: str = "2",
    aux: bool = False,
) -> list[str]:
    """Every required checkpoint entry absent from ``model_dir``; folders end with ``/``.

    ``version`` picks the file list (2 or 2.5); ``aux`` adds the auxiliary models that
    upstream would otherwise download into ``hf_cache/``.  ``cfg_path``, when given,
    replaces ``<model_dir>/config.yaml`` and is reported by its path.
    """
    missing = []
    for name in CHECKPOINT_FILES_25 if version == "2.5" else CHECKPOINT_FILES:
        if name == "config.yaml" and cfg_path is not None:
            if not os.path.isfile(cfg_path):
                missing.append(cfg_path)
        elif not os.path.isfile(os.path.join(model_dir, name)):
            missing.append(name)
    if qwen_emo and not os.path.isdir(os.path.join(model_dir, QWEN_EMO_DIR)):
        missing.append(QWEN_EMO_DIR + "/")
    if aux:
        for name in AUX_FILES_25 if version == "2.5" else AUX_FILES:
            if not os.path.isfile(os.path.join(model_dir, *name.split("/"))):
                missing.append(name)
    return missing


def aux_paths(model_dir: str) -> dict[str, str]:
    """Upstream's ``aux_paths``: the auxiliary models in ``<model_dir>/hf_cache``."""
    cache = os.path.join(model_dir, "hf_cache")
    return {
        "w2v_bert": os.path.join(cache, "w2v-bert-2.0"),
        "semantic_codec": os.path.join(cache, "semantic_codec_model.safetensors"),
        "campplus": os.path.join(cache, "campplus_cn_common.bin"),
        "bigvgan": os.path.join(cache, "bigvgan"),
    }


def installation_problem(prefer: tuple[str, ...]) -> Union[str, None]:
    """Why no code for the model versions in ``prefer`` can run here, or None (an engine's ``probe``)."""
    try:
        flavour = find_flavour(prefer)
    except (Exception, SystemExit) as exc:  # the package's __init__ failed
        return f"importing the indextts package fails: {type(exc).__name__}: {exc}"
    if flavour is None:
        versions = " or ".join(f"IndexTTS-{v}" for v in prefer)
        return (
            f"no installed code for {versions} (see the IndexTTS set-up guide, docs/indextts.md in the source "
            "repository; `indextts-client doctor` tells more)"
        )
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return None


def import_hint(exc: BaseException) -> str:
    """Advice for the import errors people hit most, to append to the error's message."""
    text = str(exc)
    if "OffloadedCache" in text or "QuantizedCacheConfig" in text:
        return (
            "; upstream IndexTTS needs transformers==4.52.1 and this venv has a newer one "
            "(pip install transformers==4.52.1, or use the PyPI package indextts2-inference with transformers>=5)"
        )
    if "torch" in text:
        return (
            "; install torch into this venv as upstream's pins ask (the IndexTTS set-up guide, docs/indextts.md "
            "in the source repository)"
        )
    return ""

"""The doctor's report: what ``python -m indextts_sidecar --doctor`` prints and the client reads.

A JSON document (``msgspec.json``) whose fields are only ever added; ``doctor`` is its schema
version.  Both ends import these types; the probing lives in the sidecar's private
``_doctor`` module.
"""

from __future__ import annotations

from typing import Union

import msgspec

from .engine_info import EngineDescription

__all__ = [
    "DOCTOR_VERSION",
    "TRANSFORMERS_PIN",
    "CheckpointInfo",
    "DoctorReport",
    "IndexTTSInfo",
    "Problem",
    "PythonInfo",
    "TorchInfo",
    "TransformersInfo",
    "is_indextts",
]

#: Version of the report's schema; fields are only ever added.
DOCTOR_VERSION = 1
#: The transformers version upstream IndexTTS pins.
TRANSFORMERS_PIN = "4.52.1"


class Problem(msgspec.Struct, kw_only=True):
    """Something wrong, and what to do about it."""

    what: str
    fix: str


class PythonInfo(msgspec.Struct, kw_only=True):
    version: str = ""
    executable: str = ""
    implementation: str = ""
    platform: str = ""


class TorchInfo(msgspec.Struct, kw_only=True):
    importable: bool = False
    version: Union[str, None] = None
    error: Union[str, None] = None
    cuda_available: bool = False
    #: The CUDA version torch was built with.
    cuda_version: Union[str, None] = None
    cuda_devices: list[str] = msgspec.field(default_factory=list)
    mps_available: bool = False
    xpu_available: bool = False


class IndexTTSInfo(msgspec.Struct, kw_only=True):
    found: bool = False
    #: Directory of the ``indextts`` package.
    location: Union[str, None] = None
    #: ``"2"``, ``"2.5"`` or ``"pypi"`` (the ``indextts2-inference`` repackaging of IndexTTS-2).
    flavour: Union[str, None] = None
    label: Union[str, None] = None
    #: The engine name to run it with (``indextts2``, ``indextts2.5``).
    engine: Union[str, None] = None
    #: Model modules present: ``indextts.infer_v2``, ``indextts.infer_v2_5``.
    modules: list[str] = msgspec.field(default_factory=list)
    #: Whether the flavour's module imports (this is where version conflicts show).
    imports: bool = False
    error: Union[str, None] = None
    #: The distribution that installed it (``indextts``, ``indextts2-inference``) and its version.
    distribution: Union[str, None] = None
    version: Union[str, None] = None


class TransformersInfo(msgspec.Struct, kw_only=True):
    version: Union[str, None] = None
    pin: str = TRANSFORMERS_PIN
    #: ``ok``, ``missing``, ``mismatch`` (another 4.x), ``conflict`` (>= 5 with upstream),
    #: ``too_old`` (< 5 with the PyPI repackaging) or ``unknown`` (no indextts to judge by).
    status: str = "missing"
    note: str = ""


class CheckpointInfo(msgspec.Struct, kw_only=True):
    model_dir: Union[str, None] = None
    checked: bool = False
    exists: bool = False
    present: list[str] = msgspec.field(default_factory=list)
    missing: list[str] = msgspec.field(default_factory=list)
    #: Entries this flavour does not need by default (``qwen0.6bemo4-merge/`` on 2.5, ``glossary.yaml``).
    optional_missing: list[str] = msgspec.field(default_factory=list)
    #: Whether ``<model_dir>/hf_cache`` (auxiliary models for offline use) exists.
    hf_cache: bool = False
    #: The model version the directory holds (``"2"``, ``"2.5"``), from its config and files.
    model_version: Union[str, None] = None
    #: The engine that runs it.
    engine: Union[str, None] = None
    #: Auxiliary models absent from ``hf_cache/`` (the sidecar refuses to download them
    #: unless started with ``-o allow_download=true``).
    aux_missing: list[str] = msgspec.field(default_factory=list)


class DoctorReport(msgspec.Struct, kw_only=True):
    """Everything the doctor found.  ``ok`` is true when nothing blocks synthesis."""

    doctor: int = DOCTOR_VERSION
    ok: bool = False
    #: False when the doctor could not run at all (set by the client, never by the sidecar).
    ran: bool = True
    python: PythonInfo = msgspec.field(default_factory=PythonInfo)
    #: Versions by package name; None when not installed.
    packages: dict[str, Union[str, None]] = msgspec.field(default_factory=dict)
    torch: TorchInfo = msgspec.field(default_factory=TorchInfo)
    indextts: IndexTTSInfo = msgspec.field(default_factory=IndexTTSInfo)
    transformers: TransformersInfo = msgspec.field(default_factory=TransformersInfo)
    checkpoints: CheckpointInfo = msgspec.field(default_factory=CheckpointInfo)
    #: The engine asked about (``--engine``); None: IndexTTS, whichever flavour is installed.
    engine: Union[str, None] = None
    #: What that engine's own check found; None when no engine was named.
    engine_info: Union[EngineDescription, None] = None
    #: What blocks synthesis.
    problems: list[Problem] = msgspec.field(default_factory=list)
    #: What works but deserves attention.
    warnings: list[Problem] = msgspec.field(default_factory=list)


def is_indextts(engine: Union[str, None]) -> bool:
    """Whether the doctor's IndexTTS checks apply to ``engine`` (None: the doctor's default)."""
    return engine is None or engine.startswith("indextts")

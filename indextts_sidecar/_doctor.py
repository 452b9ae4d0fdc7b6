"""``python -m indextts_sidecar --doctor [--model-dir DIR]``: is this venv ready for IndexTTS?

Run it with the engine venv's interpreter.  It prints one JSON object (a
:class:`DoctorReport`) to the real stdout and exits 0; whatever the probed libraries
print goes to stderr.  The report lists what it found and, under ``problems``, each thing
that blocks synthesis with what to do about it; ``warnings`` hold the rest.
``indextts_client._doctor`` runs it from the parent's venv and renders the report.

Importing this module costs only the standard library and msgspec: the client decodes
reports with the same structs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import sys
from typing import Any, Union

import msgspec

from .protocol.doctor import (
    TRANSFORMERS_PIN,
    CheckpointInfo,
    DoctorReport,
    IndexTTSInfo,
    Problem,
    PythonInfo,
    TorchInfo,
    TransformersInfo,
    is_indextts,
)

# The report's types live in protocol.doctor, which the client imports too.
__all__ = ["build_report", "main"]

_UPSTREAM_INSTALL = (
    "git clone https://github.com/index-tts/index-tts && pip install -e ./index-tts in this venv "
    "(upstream's pins: torch 2.8, transformers==4.52.1, Python < 3.12); see the IndexTTS set-up guide, "
    "docs/indextts.md in the source repository"
)


# ------------------------------------------------------------------ probes


def _version(distribution: str) -> Union[str, None]:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    digits = "".join(c for c in head if c.isdigit())
    return int(digits) if digits else 0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _probe_python() -> PythonInfo:
    return PythonInfo(
        version=platform.python_version(),
        executable=sys.executable,
        implementation=platform.python_implementation(),
        platform=platform.platform(),
    )


def _probe_torch() -> TorchInfo:
    info = TorchInfo()
    try:
        torch: Any = importlib.import_module("torch")
    except (Exception, SystemExit) as exc:  # a broken torch can raise anything, SystemExit included
        info.error = _describe(exc)
        return info
    info.importable = True
    info.version = str(getattr(torch, "__version__", None) or _version("torch"))
    try:
        info.cuda_available = bool(torch.cuda.is_available())
        info.cuda_version = getattr(getattr(torch, "version", None), "cuda", None)
        if info.cuda_available:
            info.cuda_devices = [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]
    except Exception as exc:
        info.error = f"CUDA probe failed: {_describe(exc)}"
    try:
        mps = getattr(getattr(torch, "backends", None), "mps", None)
        info.mps_available = bool(mps is not None and mps.is_available())
        xpu = getattr(torch, "xpu", None)
        info.xpu_available = bool(xpu is not None and xpu.is_available())
    except Exception as exc:
        info.error = f"MPS/XPU probe failed: {_describe(exc)}"
    return info


def _probe_indextts(version: Union[str, None] = None) -> IndexTTSInfo:
    """The installed code that runs ``version`` (the checkpoint directory's), else any."""
    from .engines.indextts._install import PYPI25_DISTRIBUTION, PYPI_DISTRIBUTION, find_flavour, import_hint

    info = IndexTTSInfo()
    try:
        spec = importlib.util.find_spec("indextts") or importlib.util.find_spec("indextts25")
    except (ImportError, ValueError) as exc:
        info.error = _describe(exc)
        return info
    if spec is None:
        return info
    info.found = True
    modules = ("indextts.infer_v2", "indextts.infer_v2_5", "indextts25.infer_v2_5")
    try:
        flavour = find_flavour((version,) if version else ("2.5", "2"))
        info.modules = [m for m in modules if _module_exists(m)]
    except (Exception, SystemExit) as exc:  # the package's __init__ failed
        info.error = f"importing the indextts package fails: {_describe(exc)}{import_hint(exc)}"
        return info
    if flavour is None:
        info.location = next(iter(spec.submodule_search_locations or []), None) or spec.origin
        wanted = f"code for IndexTTS-{version} checkpoints" if version else "indextts.infer_v2 nor indextts.infer_v2_5"
        info.error = f"the installed IndexTTS has no {wanted} (it has: {', '.join(info.modules) or 'nothing'})"
        return info
    info.location = flavour.location
    info.flavour = flavour.kind
    info.label = flavour.label
    info.engine = flavour.engine
    info.distribution = {"pypi": PYPI_DISTRIBUTION, "pypi2.5": PYPI25_DISTRIBUTION}.get(flavour.kind, "indextts")
    info.version = _version(info.distribution)
    try:
        importlib.import_module(flavour.module)
    except (Exception, SystemExit) as exc:
        info.error = f"importing {flavour.module} fails: {_describe(exc)}{import_hint(exc)}"
        return info
    info.imports = True
    return info


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _judge_transformers(info: IndexTTSInfo) -> TransformersInfo:
    version = _version("transformers")
    result = TransformersInfo(version=version)
    if version is None:
        result.status = "missing"
        return result
    if info.flavour is None:
        result.status = "unknown"
        result.note = "no IndexTTS found to check the version against"
    elif info.flavour in ("pypi", "pypi2.5"):
        result.status = "ok" if _major(version) >= 5 else "too_old"
        result.note = f"{info.distribution} needs transformers>=5"
    elif _major(version) >= 5:
        result.status = "conflict"
        result.note = f"upstream IndexTTS pins {TRANSFORMERS_PIN} and fails with transformers>=5 (OffloadedCache)"
    elif version != TRANSFORMERS_PIN:
        result.status = "mismatch"
        result.note = f"upstream IndexTTS pins {TRANSFORMERS_PIN}"
    else:
        result.status = "ok"
    return result


def _probe_checkpoints(model_dir: Union[str, None], flavour: Union[str, None]) -> CheckpointInfo:
    from .engines.indextts._install import (
        AUX_FILES,
        AUX_FILES_25,
        CHECKPOINT_FILES,
        CHECKPOINT_FILES_25,
        QWEN_EMO_DIR,
        checkpoint_version,
        missing_checkpoints,
    )

    if model_dir is None:
        return CheckpointInfo()
    info = CheckpointInfo(model_dir=os.path.abspath(model_dir), checked=True, exists=os.path.isdir(model_dir))
    version = checkpoint_version(model_dir) or ("2.5" if flavour in ("2.5", "pypi2.5") else "2")
    info.model_version = version
    info.engine = "indextts2.5" if version == "2.5" else "indextts2"
    # The Qwen emotion model is loaded by default on IndexTTS-2 (always by indextts2-inference), not on 2.5.
    needs_qwen = version == "2"
    qwen = QWEN_EMO_DIR + "/"
    info.missing = missing_checkpoints(model_dir, qwen_emo=needs_qwen, version=version)
    files = list(CHECKPOINT_FILES_25 if version == "2.5" else CHECKPOINT_FILES)
    required = [*files, qwen] if needs_qwen else files
    info.present = [entry for entry in required if entry not in info.missing]
    for entry in ["glossary.yaml"] if needs_qwen else [qwen, "glossary.yaml"]:
        found = os.path.exists(os.path.join(model_dir, entry))
        (info.present if found else info.optional_missing).append(entry)
    info.hf_cache = os.path.isdir(os.path.join(model_dir, "hf_cache"))
    if flavour != "pypi":  # indextts2-inference reads the Hugging Face cache instead
        aux = AUX_FILES_25 if version == "2.5" else AUX_FILES
        info.aux_missing = [name for name in aux if not os.path.isfile(os.path.join(model_dir, *name.split("/")))]
    return info


# ------------------------------------------------------------------ verdict


def _judge(report: DoctorReport) -> None:
    problems, warnings = report.problems, report.warnings
    torch, tts, tf, ck = report.torch, report.indextts, report.transformers, report.checkpoints
    if not torch.importable:
        problems.append(
            Problem(what=f"torch does not import: {torch.error}", fix=f"install upstream's pins: {_UPSTREAM_INSTALL}")
        )
    elif not (torch.cuda_available or torch.mps_available or torch.xpu_available):
        warnings.append(
            Problem(
                what="no CUDA, MPS or XPU device: IndexTTS would run on the CPU, far slower than real time",
                fix="install a CUDA build of torch matching the driver (see the index-tts README), or accept CPU speed",
            )
        )
    elif torch.error:
        warnings.append(Problem(what=torch.error, fix="check the torch installation and the GPU driver"))
    if not tts.found:
        problems.append(
            Problem(
                what="indextts is not installed in this interpreter",
                fix=f"{_UPSTREAM_INSTALL}; or pip install indextts2-inference (IndexTTS-2 only, transformers>=5)",
            )
        )
    elif not tts.imports:
        fix = f"reinstall upstream's pinned dependencies in this venv: {_UPSTREAM_INSTALL}"
        if tf.status == "conflict" or "OffloadedCache" in (tts.error or ""):
            fix = f"pip install transformers=={TRANSFORMERS_PIN} in this venv"
        problems.append(Problem(what=tts.error or "indextts does not import", fix=fix))
    if tts.found and tf.status == "missing":
        problems.append(
            Problem(what="transformers is not installed", fix=f"pip install transformers=={TRANSFORMERS_PIN}")
        )
    elif tf.status == "conflict":
        problems.append(
            Problem(
                what=f"transformers {tf.version} conflicts with upstream IndexTTS, which pins {TRANSFORMERS_PIN}",
                fix=f"pip install transformers=={TRANSFORMERS_PIN} in this venv (keep transformers>=5 in the parent's "
                "venv: that is what the two-venv layout is for)",
            )
        )
    elif tf.status == "mismatch":
        warnings.append(
            Problem(
                what=f"transformers {tf.version} is not upstream's pin {TRANSFORMERS_PIN}",
                fix=f"pip install transformers=={TRANSFORMERS_PIN} unless you know this version works",
            )
        )
    elif tf.status == "too_old":
        warnings.append(
            Problem(
                what=f"transformers {tf.version} is older than indextts2-inference requires (>=5)",
                fix="pip install 'transformers>=5'",
            )
        )
    if tts.flavour in ("2", "2.5") and sys.version_info >= (3, 12):
        warnings.append(
            Problem(
                what=f"Python {report.python.version}: upstream IndexTTS pins Python < 3.12",
                fix="create the engine venv with Python 3.10 or 3.11",
            )
        )
    if not ck.checked:
        warnings.append(
            Problem(what="checkpoints not checked", fix="pass --model-dir DIR (the engine's -o model_dir=DIR)")
        )
    else:
        _judge_checkpoints(report)


def _judge_checkpoints(report: DoctorReport) -> None:
    from .engines.indextts._install import QWEN_EMO_DIR

    ck = report.checkpoints
    if ck.model_version == "2.5":
        download = f"hf download IndexTeam/IndexTTS-2.5 --local-dir {ck.model_dir}"
    else:
        download = f"hf download IndexTeam/IndexTTS-2 --local-dir {ck.model_dir}"
    if not ck.exists:
        report.problems.append(Problem(what=f"checkpoint directory {ck.model_dir} does not exist", fix=download))
        return
    if ck.missing:
        fix = download
        if ck.missing == [QWEN_EMO_DIR + "/"] and report.indextts.flavour != "pypi":
            # indextts2-inference has no use_qwen_emo (it always loads the Qwen model): no such way out there.
            fix += " (or run the engine with -o use_qwen_emo=false: emotion from text is then unavailable)"
        report.problems.append(
            Problem(what=f"checkpoint directory {ck.model_dir} lacks: {', '.join(ck.missing)}", fix=fix)
        )
    if QWEN_EMO_DIR + "/" in ck.optional_missing:
        report.warnings.append(
            Problem(
                what=f"{QWEN_EMO_DIR}/ is missing: emotion from text (use_qwen_emo=true) will not work",
                fix=download,
            )
        )
    tts = report.indextts
    if tts.engine is not None and ck.engine is not None and tts.engine != ck.engine:
        report.problems.append(
            Problem(
                what=f"{ck.model_dir} holds an IndexTTS-{ck.model_version} model, but the installed code is "
                f"{tts.label}",
                fix=f"install the code for IndexTTS-{ck.model_version}, and run --engine {ck.engine}",
            )
        )
    if tts.flavour == "pypi":
        report.warnings.append(
            Problem(
                what="indextts2-inference reads its auxiliary models (w2v-bert-2.0, MaskGCT codec, campplus, "
                "BigVGAN) from the Hugging Face cache, not from hf_cache/, and downloads them when absent",
                fix="fill the cache once online, then give the sidecar HF_HOME=<that cache> and HF_HUB_OFFLINE=1",
            )
        )
    elif ck.aux_missing:
        report.problems.append(
            Problem(
                what=f"{ck.model_dir} lacks auxiliary models: {', '.join(ck.aux_missing)}; the sidecar never "
                "downloads them on its own",
                fix="copy a filled hf_cache/ over, or run one load online with -o allow_download=true",
            )
        )


def build_report(model_dir: Union[str, None] = None, engine: Union[str, None] = None) -> DoctorReport:
    """Probe this interpreter for ``engine`` (None: IndexTTS).

    For an IndexTTS engine it imports torch and indextts: run it where stdout may be
    written to.  Any other engine is judged by its own check alone: torch, transformers
    and the checkpoints are not its business.
    """
    from ._version import __version__
    from .engines import describe_engine

    report = DoctorReport(python=_probe_python(), engine=engine)
    report.packages = {
        "indextts_sidecar": __version__,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
    }
    if engine is not None:
        report.engine_info = describe_engine(engine)
    if not is_indextts(engine):
        info = report.engine_info
        assert info is not None
        if not info.available:
            report.problems.append(
                Problem(
                    what=f"engine {engine!r} cannot run here: {info.problem}",
                    fix="install what it needs in this venv (the engines guide, docs/engines.md in the source "
                    "repository, says what), or pick another with --engine",
                )
            )
        report.ok = not report.problems
        return report
    report.torch = _probe_torch()
    if report.torch.version:
        report.packages["torch"] = report.torch.version
    from .engines.indextts._install import checkpoint_version

    # The checkpoint directory decides which model version (and so which code) is wanted.
    version = checkpoint_version(model_dir) if model_dir is not None else None
    report.indextts = _probe_indextts(version)
    report.packages["indextts"] = report.indextts.version
    report.transformers = _judge_transformers(report.indextts)
    report.checkpoints = _probe_checkpoints(model_dir, report.indextts.flavour)
    _judge(report)
    report.ok = not report.problems
    return report


def main(model_dir: Union[str, None] = None, engine: Union[str, None] = None) -> int:
    """Print the report as one JSON line on the real stdout; library output goes to stderr."""
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        try:
            report = build_report(model_dir, engine)
        except Exception as exc:  # the doctor must always answer
            report = DoctorReport(
                problems=[Problem(what=f"the doctor itself failed: {_describe(exc)}", fix="report this as a bug")]
            )
        sys.stdout.flush()
        data: Any = msgspec.json.encode(report) + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(real_stdout, view) :]
    finally:
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    return 0

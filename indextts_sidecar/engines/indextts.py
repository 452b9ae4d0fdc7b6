"""IndexTTS-2 and IndexTTS-2.5 engines: upstream's ``IndexTTS2`` class, driven keyword by keyword.

Three engines share one adapter:

``indextts2``
    ``indextts.infer_v2.IndexTTS2``: upstream IndexTTS-2 (a git checkout installed with
    ``pip install -e``) or the PyPI repackaging ``indextts2-inference``, which installs the
    same module name with another signature and another chunk scale.
``indextts2.5``
    ``indextts.infer_v2_5.IndexTTS2``: upstream IndexTTS-2.5.
``indextts``
    Whichever is installed, 2.5 preferred, resolved when the model loads.

This module imports only the standard library and msgspec.  ``indextts`` (and with it
torch) is imported inside :meth:`load`, on the sidecar's engine thread, after the sidecar
has moved fd 1 out of the way of upstream's prints; numpy is imported on first use.
Every call into the model happens on that one engine thread: upstream's instance is not
thread-safe, and nothing here starts a thread that touches it (the heartbeat thread only
reports progress).

See docs/indextts.md for the set-up, the option tables and the emotion semantics.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import inspect
import logging
import math
import os
import re
import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union

import msgspec

from ..protocol import EMOTION_NAMES, EmotionAudio, EmotionText, EmotionVector
from . import (
    Cancelled,
    Engine,
    EngineError,
    LoadError,
    ProgressFn,
    RequestError,
    SpeedControl,
    SynthesisRequest,
    heartbeat,
)

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "AUX_FILES",
    "AUX_FILES_25",
    "CHECKPOINT_FILES",
    "CHECKPOINT_FILES_25",
    "EMOTION_BIAS",
    "LANGUAGES",
    "NATIVE_SAMPLE_RATE",
    "QWEN_EMO_DIR",
    "Flavour",
    "IndexTTS2Engine",
    "IndexTTS2Options",
    "IndexTTS2RequestOptions",
    "IndexTTS25Engine",
    "IndexTTS25Options",
    "IndexTTS25RequestOptions",
    "IndexTTSAuto",
    "IndexTTSAutoOptions",
    "checkpoint_version",
    "emotion_weights",
    "find_flavour",
    "missing_checkpoints",
    "to_pcm16",
]

log = logging.getLogger(__name__)

#: IndexTTS-2 and 2.5 both emit 22050 Hz mono.
NATIVE_SAMPLE_RATE = 22050
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
#: Languages IndexTTS-2.5 speaks (upstream's web UI offers exactly these).  Each is a
#: language token of upstream's tokenizer; anything else would go in as literal text.
LANGUAGES = ("zh", "en", "ja", "es", "ar")
#: The distribution names of the PyPI repackagings.
PYPI_DISTRIBUTION = "indextts2-inference"
PYPI25_DISTRIBUTION = "indextts25-inference"
#: Streamed chunks louder than this cannot be on the [-1, 1] scale.
_UNIT_SCALE_CEILING = 4.0
#: Seconds between heartbeats while a long step runs (constructing, generating a segment).
HEARTBEAT_INTERVAL = 2.0
#: Tolerance of the emotion-vector sum rule (float rounding of weights like 0.1 + 0.2).
_SUM_TOLERANCE = 1e-6
#: Upstream's web UI scales each emotion weight by these (happy ... calm) and then caps the
#: sum at 0.8 (``IndexTTS2.normalize_emo_vec``), to de-emphasise emotions that sound odd.
EMOTION_BIAS = (0.9375, 0.875, 1.0, 1.0, 0.9375, 0.9375, 0.6875, 0.5625)
EMOTION_SUM_CAP = 0.8
#: Reference conditionings kept per engine by default (``voice_cache`` engine option).
VOICE_CACHE_DEFAULT = 4

_Lang = Annotated[str, msgspec.Meta(pattern=r"(?i)^(zh|en|ja|es|ar)$")]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
_PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]

# ------------------------------------------------------------------ options


class _Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Engine options shared by every flavour.  None leaves upstream's default in place."""

    #: The checkpoint directory (upstream's ``model_dir``).
    model_dir: str = "checkpoints"
    #: The model config; None means ``<model_dir>/config.yaml``.
    cfg_path: Union[str, None] = None
    #: ``cuda:0``, ``cpu``, ``mps``, ``xpu``...; None lets upstream pick (cuda, xpu, mps, cpu).
    device: Union[str, None] = None
    use_cuda_kernel: Union[bool, None] = None
    use_deepspeed: Union[bool, None] = None
    use_accel: Union[bool, None] = None
    use_torch_compile: Union[bool, None] = None
    #: Load the Qwen emotion model (emotion from text).  Upstream defaults: 2 on, 2.5 off.
    use_qwen_emo: Union[bool, None] = None
    #: Let upstream download missing auxiliary models (w2v-bert, campplus, BigVGAN...) into
    #: ``<model_dir>/hf_cache``.  Off: a missing one fails the load, named, and the sidecar
    #: never touches the network.
    allow_download: bool = False
    #: Voice conditionings kept (keyed by the reference file's path, size and mtime), so
    #: switching between recent voices skips reprocessing them.  0 keeps only upstream's own.
    voice_cache: _NonNegativeInt = VOICE_CACHE_DEFAULT
    #: Scale emotion vectors as upstream's web UI does (per-emotion bias, sum capped at 0.8)
    #: unless a request says otherwise, so a vector sounds the same as there.
    normalize_emotion: bool = True


class IndexTTS2Options(_Options):
    """Engine options of ``indextts2``."""

    #: Half precision for the GPT (upstream's ``use_fp16``).
    fp16: Union[bool, None] = None


class IndexTTS25Options(_Options):
    """Engine options of ``indextts2.5``."""

    #: bfloat16 (upstream's ``use_bf16``).
    bf16: Union[bool, None] = None
    #: The language of requests that do not set ``options.lang``.
    lang: _Lang = "en"


class IndexTTSAutoOptions(_Options):
    """Engine options of ``indextts``: those of both; the one the installed flavour lacks is dropped."""

    fp16: Union[bool, None] = None
    bf16: Union[bool, None] = None
    lang: Union[_Lang, None] = None


class IndexTTS2RequestOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Per-request options of ``indextts2``.  None leaves upstream's default in place."""

    #: Sample emotion rows at random (more variety, lower speaker fidelity).
    use_random: Union[bool, None] = None
    #: Silence between segments, in milliseconds (upstream default 200).
    interval_silence: Union[_NonNegativeInt, None] = None
    #: Text tokens per segment (upstream default 120); smaller segments stream sooner.
    max_text_tokens_per_segment: Union[_PositiveInt, None] = None
    #: Upstream IndexTTS-2 only: make the first segments shorter, for earlier first audio.
    more_segment_before: Union[_NonNegativeInt, None] = None
    #: PyPI repackaging only: its counterpart of ``more_segment_before``.
    quick_streaming_tokens: Union[_NonNegativeInt, None] = None
    #: Scale an emotion vector as upstream's web UI does; None: the engine option.
    normalize_emotion: Union[bool, None] = None
    # Sampling options of the GPT (upstream's ``generation_kwargs``).
    #: Refused: upstream always samples (it pops ``do_sample`` and passes True).
    do_sample: Union[bool, None] = None
    temperature: Union[_PositiveFloat, None] = None
    top_p: Union[Annotated[float, msgspec.Meta(gt=0, le=1)], None] = None
    top_k: Union[_NonNegativeInt, None] = None
    num_beams: Union[_PositiveInt, None] = None
    repetition_penalty: Union[_PositiveFloat, None] = None
    length_penalty: Union[float, None] = None
    max_mel_tokens: Union[_PositiveInt, None] = None

    def __post_init__(self) -> None:
        # msgspec lets NaN and infinities through an unbounded float.
        if self.length_penalty is not None and not math.isfinite(self.length_penalty):
            raise ValueError("length_penalty must be a finite number")


class IndexTTS25RequestOptions(IndexTTS2RequestOptions):
    """Per-request options of ``indextts2.5`` (and of ``indextts``, checked against the flavour)."""

    #: The text's language: zh, en, ja, es or ar; None uses the engine option ``lang``.
    lang: Union[_Lang, None] = None
    #: Speech duration factor: below 1 faster, above 1 slower.
    duration_factor: Union[Annotated[float, msgspec.Meta(ge=0.5, le=2.0)], None] = None
    #: Normalize numbers, dates and the like before synthesis (upstream default on).
    text_normalization: Union[bool, None] = None


#: Engine option -> upstream constructor keyword.
_CONSTRUCTOR_KEYWORDS = {
    "device": "device",
    "fp16": "use_fp16",
    "bf16": "use_bf16",
    "use_cuda_kernel": "use_cuda_kernel",
    "use_deepspeed": "use_deepspeed",
    "use_accel": "use_accel",
    "use_torch_compile": "use_torch_compile",
    "use_qwen_emo": "use_qwen_emo",
}
#: Request options that are named parameters of ``infer``; the rest go to the sampler.
_INFER_KEYWORDS = (
    "use_random",
    "interval_silence",
    "max_text_tokens_per_segment",
    "more_segment_before",
    "quick_streaming_tokens",
    "lang",
    "duration_factor",
    "text_normalization",
)
_GENERATION_KEYWORDS = (
    "temperature",
    "top_p",
    "top_k",
    "num_beams",
    "repetition_penalty",
    "length_penalty",
    "max_mel_tokens",
)

# ------------------------------------------------------------------ flavours


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
_MODULES = {
    "2": (("indextts.infer_v2", "2"),),
    "2.5": (("indextts.infer_v2_5", "2.5"), ("indextts25.infer_v2_5", "pypi2.5")),
}


def _package_dir(package: str = "indextts") -> Union[str, None]:
    """The directory of ``package`` if it is installed (imports nothing)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return locations[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _is_pypi(package_dir: Union[str, None]) -> bool:
    """Whether ``indextts2-inference`` is installed and owns the ``indextts`` found on the path."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PYPI_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    if package_dir is None:
        return True
    try:
        owned = str(dist.locate_file("indextts"))
        return bool(os.path.realpath(owned) == os.path.realpath(package_dir))
    except (OSError, TypeError, NotImplementedError):
        return True


def find_flavour(prefer: Iterable[str] = ("2.5", "2")) -> Union[Flavour, None]:
    """The first installed flavour for the model versions in ``prefer``, without importing torch.

    Looking for a submodule imports its package (upstream's ``__init__`` is empty), never
    the module holding the model.  Returns None when none of ``prefer`` is installed.
    """
    for version in prefer:
        for module, kind in _MODULES[version]:
            package = module.partition(".")[0]
            package_dir = _package_dir(package)
            if package_dir is None or importlib.util.find_spec(module) is None:
                continue
            if kind == "2" and _is_pypi(package_dir):
                kind = "pypi"
            return Flavour(kind=kind, module=module, location=package_dir)
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


def emotion_weights(values: list[float], *, normalize: bool) -> list[float]:
    """The weights sent upstream: with ``normalize``, biased and capped as upstream's web UI does."""
    if not normalize:
        return list(values)
    biased = [value * bias for value, bias in zip(values, EMOTION_BIAS, strict=True)]
    total = math.fsum(biased)
    if total > EMOTION_SUM_CAP:
        biased = [value * (EMOTION_SUM_CAP / total) for value in biased]
    return biased


# ------------------------------------------------------------------ audio


def to_pcm16(samples: Any, *, unit_scale: bool) -> npt.NDArray[Any]:
    """One chunk of model output as contiguous little-endian int16 samples.

    Accepts a torch tensor (any device), a numpy array or a sequence, mono in any of the
    shapes ``(n,)``, ``(1, n)`` and ``(n, 1)``.  int16 passes through untouched.  Floats are
    rounded to the nearest integer and clipped, after scaling by 32768 when ``unit_scale``,
    so int16 -> float -> int16 round-trips exactly on either scale.
    """
    import numpy as np

    array = _as_numpy(samples)
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    elif array.ndim != 1:
        raise EngineError(f"the model returned audio of shape {array.shape}, not mono", code="internal")
    out: npt.NDArray[Any]
    if array.dtype == np.int16:
        out = np.ascontiguousarray(array, dtype="<i2")
    elif array.dtype.kind in "iub":
        out = np.clip(array, -32768, 32767).astype("<i2")
    else:
        # float32 holds every int16 exactly, and scaling by 32768 is exact in binary floats.
        floats = array.astype(np.float64 if array.dtype.itemsize > 4 else np.float32)
        if unit_scale:
            np.multiply(floats, 32768.0, out=floats)
        np.nan_to_num(floats, copy=False, nan=0.0, posinf=32767.0, neginf=-32768.0)
        out = np.clip(np.rint(floats), -32768, 32767).astype("<i2")
    return out


def _as_numpy(samples: Any) -> npt.NDArray[Any]:
    import numpy as np

    if isinstance(samples, np.ndarray):
        return samples
    result: npt.NDArray[Any]
    value = samples
    for step in ("detach", "cpu"):
        method = getattr(value, step, None)
        if callable(method):
            value = method()
    to_numpy = getattr(value, "numpy", None)
    if callable(to_numpy):
        try:
            result = np.asarray(to_numpy())
        except TypeError:  # bfloat16 and friends have no numpy dtype
            result = np.asarray(value.float().numpy())
        return result
    result = np.asarray(value)
    return result


def _peak(array: npt.NDArray[Any]) -> float:
    import numpy as np

    if not array.size or array.dtype.kind != "f":
        return 0.0
    return float(np.max(np.abs(np.nan_to_num(array))))


# ------------------------------------------------------------------ engine


class _IndexTTSEngine(Engine[Any, Any]):
    """The adapter; subclasses choose the model versions they accept."""

    native_sample_rate = NATIVE_SAMPLE_RATE
    capabilities: ClassVar[tuple[str, ...]] = (
        "streaming",
        "voice_clone",
        "emotion_vector",
        "emotion_audio",
        "emotion_text",
    )
    #: Model versions this engine may load ("2", "2.5"); the checkpoint directory picks one.
    _PREFER: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def probe(cls) -> Union[str, None]:
        return _probe(cls._PREFER)

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self._model: Any = None
        #: The flavour loaded (or last loaded); None before the first load.
        self.flavour: Union[Flavour, None] = None
        self._infer_params: frozenset[str] = frozenset()
        self._qwen_emo: Union[bool, None] = None
        self._voices = _VoiceCache(options.voice_cache)

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def info(self) -> dict[str, Any]:
        """What ``load`` reports: the flavour, the model version, where it came from, the voice cache."""
        flavour = self.flavour
        if flavour is None:
            return {}
        return {
            "flavour": flavour.label,
            "model_version": flavour.version,
            "module": flavour.module,
            "model_dir": os.path.abspath(self.options.model_dir),
            "voice_cache": self._voices.stats(),
        }

    # ---------------------------------------------------------- check

    def check(self, request: SynthesisRequest[Any]) -> None:
        """Everything that needs no model, on the event loop thread."""
        _check_text(request.text)
        if request.voice is None:
            raise RequestError(
                "IndexTTS clones a voice: set voice to the path of a speaker reference clip", field="$.voice"
            )
        _check_readable(request.voice, "$.voice", "voice reference")
        options = request.options
        if options.do_sample is not None:
            raise RequestError(
                "do_sample has no effect: upstream IndexTTS always samples (it drops the option and passes True)",
                field="$.options.do_sample",
                code="unknown_option",
            )
        emotion = request.emotion
        if isinstance(emotion, EmotionVector):
            _check_vector(emotion, normalize=self._normalize_emotion(request))
        elif isinstance(emotion, EmotionAudio):
            _check_readable(emotion.path, "$.emotion.path", "emotion reference")
            if not (math.isfinite(emotion.alpha) and 0.0 <= emotion.alpha <= 1.0):
                raise RequestError(f"emotion alpha must be in [0, 1], got {emotion.alpha}", field="$.emotion.alpha")
        elif isinstance(emotion, EmotionText) and not math.isfinite(emotion.alpha):
            raise RequestError(f"emotion alpha must be a finite number, got {emotion.alpha}", field="$.emotion.alpha")
        self._check_flavour(request)

    def _normalize_emotion(self, request: SynthesisRequest[Any]) -> bool:
        value = getattr(request.options, "normalize_emotion", None)
        return bool(self.options.normalize_emotion if value is None else value)

    def _qwen_emo_enabled(self) -> Union[bool, None]:
        """Whether the Qwen emotion model is (or will be) loaded; None when not yet known."""
        if self.loaded:
            return self._qwen_emo
        if self.options.use_qwen_emo is not None:
            return bool(self.options.use_qwen_emo)
        if len(self._PREFER) == 1:
            return self._PREFER[0] != "2.5"
        return None

    def _version(self) -> Union[str, None]:
        """The model version this engine runs, once known (the flavour, else the directory)."""
        if self.flavour is not None:
            return self.flavour.version
        if len(self._PREFER) == 1:
            return self._PREFER[0]
        return checkpoint_version(self.options.model_dir, self.options.cfg_path)

    def _check_flavour(self, request: SynthesisRequest[Any]) -> None:
        """Checks that depend on the model version or on the loaded flavour."""
        options = request.options
        if isinstance(request.emotion, EmotionText) and self._qwen_emo_enabled() is False:
            raise RequestError(
                "emotion from text needs the Qwen emotion model, which this engine runs without: "
                f"start it with -o use_qwen_emo=true (and {QWEN_EMO_DIR}/ in the checkpoint directory)",
                field="$.emotion",
            )
        version = self._version()
        if version == "2.5" and getattr(options, "more_segment_before", None) is not None:
            raise RequestError(
                "more_segment_before has no effect on IndexTTS-2.5 (its streaming never reads it)",
                field="$.options.more_segment_before",
                code="unknown_option",
            )
        if version == "2":
            for name in ("lang", "duration_factor", "text_normalization"):
                if getattr(options, name, None) is not None:
                    raise RequestError(
                        f"option {name!r} is for IndexTTS-2.5; this checkpoint is IndexTTS-2",
                        field=f"$.options.{name}",
                        code="unknown_option",
                    )
        if not self.loaded or self.flavour is None:
            return
        if isinstance(request.emotion, EmotionText) and "use_emo_text" not in self._infer_params:
            raise RequestError(
                f"the installed {self.flavour.label} has no emotion from text", field="$.emotion", code="unknown_option"
            )
        for name in _INFER_KEYWORDS:
            if getattr(options, name, None) is not None and name not in self._infer_params:
                raise RequestError(
                    f"option {name!r} is not supported by the installed {self.flavour.label}",
                    field=f"$.options.{name}",
                    code="unknown_option",
                )
        if _accelerated(self._model):
            for name in ("top_p", "top_k", "num_beams", "repetition_penalty", "length_penalty"):
                if getattr(options, name, None) is not None:
                    raise RequestError(
                        f"option {name!r} is ignored by upstream's accelerated GPT (use_accel), which honours "
                        "only temperature and max_mel_tokens",
                        field=f"$.options.{name}",
                        code="unknown_option",
                    )

    # ---------------------------------------------------------- load

    def load(self, progress: ProgressFn, cancelled: Callable[[], bool]) -> None:
        if self._model is not None:
            progress("load", 1.0, "loaded")
            return
        self.dropped_options = []
        opts = self.options
        progress("load", 0.0, "checking the installation and the checkpoint directory")
        version = self._directory_version()
        flavour = self._resolve_flavour(version)
        qwen_emo = opts.use_qwen_emo if opts.use_qwen_emo is not None else flavour.qwen_emo_default
        if flavour.kind == "pypi":
            qwen_emo = True  # indextts2-inference always loads it, whatever use_qwen_emo says
        self._check_checkpoints(flavour, qwen_emo)
        if cancelled():
            raise Cancelled
        progress("load", 0.1, f"importing {flavour.module} ({flavour.label})")
        cls = self._import(flavour)
        if cancelled():
            raise Cancelled
        kwargs = self._constructor_kwargs(cls, flavour)
        self._infer_params = _named_parameters(cls.infer_generator if flavour.streams_with_generator else cls.infer)
        if "use_qwen_emo" in kwargs:
            self._qwen_emo = bool(kwargs["use_qwen_emo"])
        elif flavour.kind == "pypi":
            self._qwen_emo = True
        else:
            default = _default_of(cls.__init__, "use_qwen_emo")
            self._qwen_emo = default if isinstance(default, bool) else None
        if self._qwen_emo and not qwen_emo:
            # The installed constructor turns it on where we assumed off: check for the folder now.
            self._check_checkpoints(flavour, True)
        lang = getattr(opts, "lang", None)
        if lang is not None and "lang" not in self._infer_params:
            self._drop("lang", flavour)
        log.info("constructing %s from %s with %s", flavour.label, flavour.module, kwargs)
        message = f"constructing {flavour.label} on {opts.device or 'the default device'}"
        progress("load", 0.3, message)
        with heartbeat(progress, "load", 0.3, message, HEARTBEAT_INTERVAL), _offline(not opts.allow_download):
            model = cls(**kwargs)
        self._model = model
        self.flavour = flavour
        self._voices.clear()
        self.sample_rate = NATIVE_SAMPLE_RATE
        progress("load", 1.0, f"loaded {flavour.label}")
        if cancelled():  # the model stays loaded: the next request uses it
            raise Cancelled

    def _directory_version(self) -> str:
        """The checkpoint directory's model version; refuses one this engine does not run."""
        opts = self.options
        version = checkpoint_version(opts.model_dir, opts.cfg_path)
        if version is None:
            # Nothing recognisable (often: no directory at all): list what this engine needs.
            version = self._PREFER[-1] if len(self._PREFER) == 1 else "2"
            qwen_emo = opts.use_qwen_emo if opts.use_qwen_emo is not None else version == "2"
            self._check_checkpoints(Flavour(kind=version, module="", location=None), bool(qwen_emo))
            return version
        if version not in self._PREFER:
            other = "indextts2.5" if version == "2.5" else "indextts2"
            raise LoadError(
                f"checkpoint directory {os.path.abspath(opts.model_dir)} holds an IndexTTS-{version} model, "
                f"which engine {self.name!r} does not run: start the sidecar with --engine {other} "
                "(or --engine indextts, which follows the directory)",
                field="model_dir",
            )
        return version

    def _resolve_flavour(self, version: str) -> Flavour:
        try:
            flavour = find_flavour((version,))
        except ImportError as exc:
            raise LoadError(f"the indextts package is installed but fails to import: {exc}{_hint(exc)}") from exc
        if flavour is not None:
            return flavour
        modules = " or ".join(module for module, _ in _MODULES[version])
        other = find_flavour(("2.5", "2"))
        if other is None and _package_dir() is None and _package_dir("indextts25") is None:
            raise LoadError(
                f"IndexTTS is not installed in this interpreter ({sys.executable}): install upstream IndexTTS "
                "into this venv (git clone https://github.com/index-tts/index-tts && pip install -e index-tts), "
                f"or the PyPI package {PYPI25_DISTRIBUTION if version == '2.5' else PYPI_DISTRIBUTION}; "
                "see docs/indextts.md; `python -m indextts_sidecar --doctor` checks the set-up"
            )
        found = f" (it has {other.label}, which cannot run this checkpoint)" if other is not None else ""
        raise LoadError(
            f"the checkpoint directory holds an IndexTTS-{version} model, and no {modules} is installed{found}"
        )

    def _check_checkpoints(self, flavour: Flavour, qwen_emo: bool) -> None:
        opts = self.options
        model_dir = opts.model_dir
        aux = flavour.local_aux and not opts.allow_download
        missing = missing_checkpoints(
            model_dir, cfg_path=opts.cfg_path, qwen_emo=qwen_emo, version=flavour.version, aux=aux
        )
        if not missing:
            return
        where = os.path.abspath(model_dir)
        state = "does not exist" if not os.path.isdir(model_dir) else "is incomplete"
        notes = []
        if QWEN_EMO_DIR + "/" in missing:
            why = "the PyPI package always loads it" if flavour.kind == "pypi" else "use_qwen_emo is on"
            notes.append(f"{QWEN_EMO_DIR}/ is needed because {why}")
        if any(name.startswith("hf_cache/") for name in missing):
            notes.append(
                "the hf_cache/ entries are auxiliary models that upstream would download: copy a filled hf_cache/ "
                "over, or start once with -o allow_download=true on a machine with network access"
            )
        note = f" ({'; '.join(notes)})" if notes else ""
        repo = "IndexTeam/IndexTTS-2.5" if flavour.version == "2.5" else "IndexTeam/IndexTTS-2"
        raise LoadError(
            f"checkpoint directory {where} {state}: missing {', '.join(missing)}{note}; download the model's "
            f"checkpoints into it (e.g. `hf download {repo} --local-dir DIR`) and set -o model_dir=DIR",
            field="model_dir",
        )

    def _import(self, flavour: Flavour) -> Any:
        try:
            with _preserved_process_state():
                module = importlib.import_module(flavour.module)
        except ImportError as exc:
            raise LoadError(f"importing {flavour.module} failed: {type(exc).__name__}: {exc}{_hint(exc)}") from exc
        cls = getattr(module, "IndexTTS2", None)
        if cls is None:
            raise LoadError(f"{flavour.module} has no IndexTTS2 class: an unsupported indextts version")
        return cls

    def _constructor_kwargs(self, cls: Any, flavour: Flavour) -> dict[str, Any]:
        """Keyword arguments for the constructor; options it does not accept are dropped and recorded."""
        opts = self.options
        accepted = _named_parameters(cls.__init__)
        open_ended = _takes_var_keyword(cls.__init__)
        kwargs: dict[str, Any] = {
            "model_dir": opts.model_dir,
            "cfg_path": opts.cfg_path if opts.cfg_path is not None else os.path.join(opts.model_dir, "config.yaml"),
        }
        for option, keyword in _CONSTRUCTOR_KEYWORDS.items():
            value = getattr(opts, option, None)
            if value is not None:
                kwargs[keyword] = value
        device = str(opts.device or "")
        if device.startswith("mps") and kwargs.get("use_fp16"):
            # Upstream turns half precision off on MPS only when it picks the device itself.
            log.warning("fp16 is slower than float32 on MPS (upstream's own choice): fp16 dropped")
            del kwargs["use_fp16"]
            self.dropped_options.append("fp16")
        if flavour.local_aux and "aux_paths" in accepted and not opts.allow_download:
            # Hand upstream the auxiliary models checked above, so it never looks further.
            kwargs["aux_paths"] = _aux_paths(opts.model_dir)
        if open_ended:
            return kwargs
        options = {"model_dir": "model_dir", "cfg_path": "cfg_path", "aux_paths": "aux_paths", **_CONSTRUCTOR_KEYWORDS}
        for option, keyword in options.items():
            if keyword in kwargs and keyword not in accepted:
                del kwargs[keyword]
                if keyword != "aux_paths":
                    self._drop(option, flavour)
        return kwargs

    def _drop(self, option: str, flavour: Flavour) -> None:
        log.warning(
            "engine option %r is not accepted by the installed %s (%s) and was dropped",
            option,
            flavour.label,
            flavour.module,
        )
        self.dropped_options.append(option)

    # ---------------------------------------------------------- synthesize

    def synthesize(
        self,
        request: SynthesisRequest[Any],
        progress: ProgressFn,
        cancelled: Callable[[], bool],
    ) -> Iterator[Any]:
        model = self._model
        flavour = self.flavour
        if model is None or flavour is None:
            raise EngineError("synthesize called before load", code="internal")
        self._check_flavour(request)
        kwargs = self._infer_kwargs(request)
        if cancelled():
            raise Cancelled
        voice = request.voice
        assert voice is not None
        restored = self._voices.restore(model, voice)
        emotion_path = kwargs.get("emo_audio_prompt")
        with heartbeat(progress, "prepare", None, "preparing the references", HEARTBEAT_INTERVAL):
            call = model.infer_generator if flavour.streams_with_generator else model.infer
            result = call(**kwargs)
        if isinstance(result, tuple):
            rate, audio = result
            self._check_rate(rate)
            yield to_pcm16(audio, unit_scale=flavour.unit_scale and _peak(_as_numpy(audio)) <= _UNIT_SCALE_CEILING)
            progress("synthesize", 1.0, "done")
            return
        if result is None or isinstance(result, (str, bytes, os.PathLike)):
            raise EngineError(f"the model returned {result!r} instead of audio", code="internal")

        def remember() -> None:
            if not restored:
                self._voices.remember(model, voice, emotion_path)

        yield from self._stream(iter(result), flavour, progress, cancelled, remember, (voice, emotion_path))

    def _stream(
        self,
        chunks: Iterator[Any],
        flavour: Flavour,
        progress: ProgressFn,
        cancelled: Callable[[], bool],
        prepared: Callable[[], None],
        references: tuple[str, Union[str, None]] = ("", None),
    ) -> Iterator[Any]:
        """Upstream's stream, segment by segment, with silence between segments only.

        Upstream yields each segment followed by ``interval_silence`` of silence, the last
        one too (and with ``interval_silence=0`` it yields its list of segments where the
        silence belongs).  A silence is held back until the next segment arrives, so the
        result matches upstream's non-streaming output sample for sample.
        """
        unit_scale = flavour.unit_scale
        voice, emotion_path = references
        segments = 0
        samples = 0
        held: Any = None
        index = 0
        try:
            while True:
                if cancelled():
                    raise Cancelled
                if index == 0:
                    stage, message = "prepare", "preparing the references and the first segment"
                else:
                    stage, message = "synthesize", f"generating segment {segments + 1}"
                is_silence = flavour.silence_after_each and index % 2 == 1
                if not is_silence:
                    progress(stage, None, message)
                with heartbeat(progress, stage, None, message, HEARTBEAT_INTERVAL):
                    try:
                        chunk = next(chunks)
                    except StopIteration:
                        break
                    except Exception as exc:
                        if index == 0:  # upstream's lazy first step: the references
                            raise EngineError(
                                f"preparing the references failed: {type(exc).__name__}: {exc}",
                                field=_failed_reference(exc, voice, emotion_path),
                            ) from exc
                        raise
                index += 1
                if index == 1:
                    prepared()
                if cancelled():
                    raise Cancelled
                if is_silence:
                    held = None if isinstance(chunk, (list, tuple)) else chunk
                    continue
                if held is not None:
                    pcm_silence = to_pcm16(held, unit_scale=False)
                    held = None
                    if pcm_silence.size:
                        samples += pcm_silence.size
                        yield pcm_silence
                array = _as_numpy(chunk)
                peak = _peak(array)
                if unit_scale and peak > _UNIT_SCALE_CEILING:
                    log.warning("%s streamed PCM-scale floats (peak %.0f); treating it as such", flavour.label, peak)
                    unit_scale = False
                pcm = to_pcm16(array, unit_scale=unit_scale)
                samples += pcm.size
                if not flavour.silence_after_each and pcm.size and not pcm.any():
                    yield pcm  # indextts25 yields the silence between segments as an item of its own
                    continue
                segments += 1
                ready = f"segment {segments} ready ({samples / NATIVE_SAMPLE_RATE:.2f} s of audio)"
                progress("synthesize", None, ready)
                if pcm.size:
                    yield pcm
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        progress("synthesize", 1.0, f"{segments} segments, {samples / NATIVE_SAMPLE_RATE:.2f} s of audio")

    def _check_rate(self, rate: Any) -> None:
        if int(rate) != NATIVE_SAMPLE_RATE:
            raise EngineError(
                f"the model returned {rate} Hz audio, not {NATIVE_SAMPLE_RATE} Hz; this sidecar does not resample",
                code="internal",
            )

    def _infer_kwargs(self, request: SynthesisRequest[Any]) -> dict[str, Any]:
        """The exact keyword arguments of ``infer`` for ``request``."""
        params = self._infer_params
        kwargs: dict[str, Any] = {"spk_audio_prompt": request.voice, "text": request.text, "output_path": None}
        if "stream_return" in params:
            kwargs["stream_return"] = True
        kwargs.update(_emotion_kwargs(request.emotion, normalize=self._normalize_emotion(request)))
        opts = request.options
        for name in _INFER_KEYWORDS:
            value = getattr(opts, name, None)
            if value is not None:
                kwargs[name] = value
        if "lang" in params:
            lang = kwargs.get("lang") or getattr(self.options, "lang", None) or "en"
            kwargs["lang"] = str(lang).lower()
        for name in _GENERATION_KEYWORDS:
            value = getattr(opts, name, None)
            if value is not None:
                kwargs[name] = value
        return kwargs

    # ---------------------------------------------------------- memory

    def unload(self) -> None:
        if self._model is None:
            return
        self._model = None
        self._voices.clear()
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            mps = getattr(torch, "mps", None)
            if mps is not None and torch.backends.mps.is_available():
                mps.empty_cache()
        except Exception as exc:  # freeing caches is best effort
            log.warning("emptying the torch caches failed: %s", exc)

    def memory(self) -> dict[str, int]:
        """CUDA or MPS memory, only if torch is already imported: never imports it."""
        torch = sys.modules.get("torch")
        if torch is None:
            return {}
        try:
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_available() and cuda.is_initialized():
                return {"cuda_allocated": int(cuda.memory_allocated()), "cuda_reserved": int(cuda.memory_reserved())}
            mps = getattr(torch, "mps", None)
            if mps is not None and torch.backends.mps.is_available():
                return {
                    "mps_allocated": int(mps.current_allocated_memory()),
                    "mps_driver": int(mps.driver_allocated_memory()),
                }
        except Exception:  # torch half-imported by the engine thread, or a backend without stats
            return {}
        return {}


def _probe(prefer: tuple[str, ...]) -> Union[str, None]:
    try:
        flavour = find_flavour(prefer)
    except (Exception, SystemExit) as exc:  # the package's __init__ failed
        return f"importing the indextts package fails: {type(exc).__name__}: {exc}"
    if flavour is None:
        versions = " or ".join(f"IndexTTS-{v}" for v in prefer)
        return f"no installed code for {versions} (see docs/indextts.md; `indextts-client doctor` tells more)"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return None


class IndexTTS2Engine(_IndexTTSEngine):
    """IndexTTS-2 (upstream's ``indextts.infer_v2``, or the PyPI repackaging)."""

    name = "indextts2"
    Options = IndexTTS2Options
    RequestOptions = IndexTTS2RequestOptions
    _PREFER = ("2",)


class IndexTTS25Engine(_IndexTTSEngine):
    """IndexTTS-2.5 (upstream's ``indextts.infer_v2_5``)."""

    name = "indextts2.5"
    capabilities = (*_IndexTTSEngine.capabilities, "lang", "duration")
    speed = SpeedControl(option="duration_factor", normal=1.0, minimum=0.5, maximum=2.0, inverse=True)
    Options = IndexTTS25Options
    RequestOptions = IndexTTS25RequestOptions
    _PREFER = ("2.5",)


class IndexTTSAuto(_IndexTTSEngine):
    """IndexTTS-2 or 2.5, as the checkpoint directory says (its config's ``version``, its files)."""

    name = "indextts"
    Options = IndexTTSAutoOptions
    RequestOptions = IndexTTS25RequestOptions
    _PREFER = ("2", "2.5")


# ------------------------------------------------------------------ helpers


def _check_text(text: str) -> None:
    """Refuse text upstream cannot speak: it raises on empty text, and 2.5 turns text without
    a letter or digit ("...") into audio from the language tag alone."""
    if not text.strip():
        raise RequestError("text is empty", field="$.text")
    if not any(character.isalnum() for character in text):
        raise RequestError(
            "text has no letter or digit to speak (punctuation and spaces alone)",
            field="$.text",
        )


def _failed_reference(exc: Union[BaseException, None], voice: str, emotion_path: Union[str, None]) -> Union[str, None]:
    """The request field naming the reference clip an error is about, when it says which."""
    if not isinstance(exc, (OSError, EOFError)):
        return None
    filename = getattr(exc, "filename", None)
    if filename is not None and emotion_path is not None and os.fspath(filename) == emotion_path:
        return "$.emotion.path"
    if filename is not None and os.fspath(filename) != voice:
        return None
    return "$.voice" if filename is not None or emotion_path is None else None


def _accelerated(model: Any) -> bool:
    """Whether upstream's GPT runs on its accel engine (``use_accel`` on CUDA)."""
    return getattr(getattr(model, "gpt", None), "accel_engine", None) is not None


def _aux_paths(model_dir: str) -> dict[str, str]:
    """Upstream's ``aux_paths``: the auxiliary models in ``<model_dir>/hf_cache``."""
    cache = os.path.join(model_dir, "hf_cache")
    return {
        "w2v_bert": os.path.join(cache, "w2v-bert-2.0"),
        "semantic_codec": os.path.join(cache, "semantic_codec_model.safetensors"),
        "campplus": os.path.join(cache, "campplus_cn_common.bin"),
        "bigvgan": os.path.join(cache, "bigvgan"),
    }


@contextmanager
def _preserved_process_state() -> Iterator[None]:
    """Import upstream without letting it change this process for good.

    Upstream's modules install warning filters and (2.5) set ``HF_HUB_CACHE`` to
    ``./checkpoints/hf_cache``, relative to whatever the working directory is.
    huggingface_hub reads that variable once, when first imported, so it is imported
    first, under the environment the sidecar was given; both are restored afterwards.
    """
    with contextlib.suppress(ImportError):
        importlib.import_module("huggingface_hub")
    filters = list(warnings.filters)
    try:
        with _restored_environ("HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
            yield
    finally:
        warnings.filters[:] = filters  # type: ignore[index]
        warnings._filters_mutated()  # type: ignore[attr-defined]


@contextmanager
def _offline(offline: bool) -> Iterator[None]:
    """While constructing: tell Hugging Face libraries not to reach the network."""
    if not offline:
        yield
        return
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    with _restored_environ(*names):
        os.environ.update(dict.fromkeys(names, "1"))
        yield


@contextmanager
def _restored_environ(*names: str) -> Iterator[None]:
    """Put the environment variables ``names`` back as they were (set or unset) on leaving."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: Upstream's per-instance reference caches this adapter saves and restores, by the role
#: they play.  Upstream keeps one speaker and one emotion reference, keyed by the path
#: string; a conformance test fails loudly if these attributes are renamed.
SPEAKER_CACHE_ATTRIBUTES = ("cache_spk_cond", "cache_s2mel_style", "cache_s2mel_prompt", "cache_mel")
SPEAKER_KEY_ATTRIBUTE = "cache_spk_audio_prompt"
EMOTION_CACHE_ATTRIBUTE = "cache_emo_cond"
EMOTION_KEY_ATTRIBUTE = "cache_emo_audio_prompt"


def _file_key(path: str) -> Union[tuple[str, int, int], None]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


class _VoiceCache:
    """The conditioning of the last ``size`` voices, keyed by file content (path, size, mtime).

    Upstream recomputes a voice's conditioning on every switch and, keyed by the path
    alone, reuses a stale one when a file is overwritten.  Before each request the
    adapter either restores a cached conditioning into upstream's one-slot cache, or
    clears that slot so upstream recomputes; after the first chunk it saves what upstream
    computed.  Runs on the engine thread only.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, int, int], tuple[Any, ...]] = OrderedDict()
        #: The file whose conditioning upstream's own slot holds, as far as this cache knows.
        self._slot: Union[tuple[str, int, int], None] = None
        self.hits = 0
        self.misses = 0

    def stats(self) -> dict[str, int]:
        return {"size": self.size, "entries": len(self._entries), "hits": self.hits, "misses": self.misses}

    def clear(self) -> None:
        self._entries.clear()
        self._slot = None

    def restore(self, model: Any, voice: str) -> bool:
        """Put ``voice``'s conditioning in upstream's slot if cached; else empty the slot."""
        if not all(hasattr(model, name) for name in (*SPEAKER_CACHE_ATTRIBUTES, SPEAKER_KEY_ATTRIBUTE)):
            return False  # an upstream without these caches: nothing to manage
        key = _file_key(voice)
        if key is not None and key == self._slot and getattr(model, SPEAKER_KEY_ATTRIBUTE, None) == voice:
            self.hits += 1  # upstream's own slot already holds this very file
            return True
        entry = self._entries.get(key) if key is not None and self.size else None
        if entry is None:
            self.misses += 1
            # Upstream compares path strings only: make it recompute, the file may have changed.
            setattr(model, SPEAKER_KEY_ATTRIBUTE, None)
            setattr(model, EMOTION_KEY_ATTRIBUTE, None)
            self._slot = None
            return False
        assert key is not None
        self._entries.move_to_end(key)
        self.hits += 1
        speaker, emotion = entry
        for name, value in zip(SPEAKER_CACHE_ATTRIBUTES, speaker, strict=True):
            setattr(model, name, value)
        setattr(model, SPEAKER_KEY_ATTRIBUTE, voice)
        setattr(model, EMOTION_CACHE_ATTRIBUTE, emotion)
        setattr(model, EMOTION_KEY_ATTRIBUTE, voice)
        self._slot = key
        return True

    def remember(self, model: Any, voice: str, emotion_path: Union[str, None]) -> None:
        """Save what upstream computed for ``voice`` (after its first chunk)."""
        key = _file_key(voice)
        if key is None or getattr(model, SPEAKER_KEY_ATTRIBUTE, None) != voice:
            return
        self._slot = key
        if not self.size:
            return
        speaker = tuple(getattr(model, name) for name in SPEAKER_CACHE_ATTRIBUTES)
        # The emotion slot holds the speaker's own clip unless another emotion clip was used.
        emotion = None
        if emotion_path is None and getattr(model, EMOTION_KEY_ATTRIBUTE, None) == voice:
            emotion = getattr(model, EMOTION_CACHE_ATTRIBUTE)
        previous = self._entries.get(key)
        if emotion is None and previous is not None:
            emotion = previous[1]
        if emotion is None:
            return  # a restore must be complete; keep what upstream has for next time
        self._entries[key] = (speaker, emotion)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def _check_readable(path: str, field: str, what: str) -> None:
    if not path:
        raise RequestError(f"{what} path is empty", field=field)
    if not os.path.exists(path):
        raise RequestError(f"{what} {path!r} does not exist", field=field)
    if not os.path.isfile(path):
        raise RequestError(f"{what} {path!r} is not a file", field=field)
    if not os.access(path, os.R_OK):
        raise RequestError(f"{what} {path!r} is not readable", field=field)


def _check_vector(emotion: EmotionVector, *, normalize: bool) -> None:
    values = emotion.values()
    for name, value in zip(EMOTION_NAMES, values, strict=True):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise RequestError(f"emotion weight {name} must be in [0, 1], got {value}", field=f"$.emotion.{name}")
    total = math.fsum(values)
    if not normalize and total > 1.0 + _SUM_TOLERANCE:
        raise RequestError(
            f"emotion weights sum to {total:g}; the sum must be at most 1 (IndexTTS mixes "
            "vector + (1 - sum) * speaker, so a larger sum inverts the speaker's own emotion)",
            field="$.emotion",
        )
    if not math.isfinite(emotion.alpha):
        raise RequestError(f"emotion alpha must be a finite number, got {emotion.alpha}", field="$.emotion.alpha")


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def _emotion_kwargs(emotion: Any, *, normalize: bool) -> dict[str, Any]:
    if isinstance(emotion, EmotionVector):
        weights = emotion_weights(list(emotion.values()), normalize=normalize)
        return {"emo_vector": weights, "emo_alpha": _clamp01(emotion.alpha)}
    if isinstance(emotion, EmotionAudio):
        return {"emo_audio_prompt": emotion.path, "emo_alpha": float(emotion.alpha)}
    if isinstance(emotion, EmotionText):
        return {"use_emo_text": True, "emo_text": emotion.text, "emo_alpha": _clamp01(emotion.alpha)}
    return {}


def _signature(fn: Any) -> Union[inspect.Signature, None]:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _named_parameters(fn: Any) -> frozenset[str]:
    sig = _signature(fn)
    if sig is None:
        return frozenset()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(name for name, p in sig.parameters.items() if p.kind in kinds)


def _takes_var_keyword(fn: Any) -> bool:
    sig = _signature(fn)
    return sig is not None and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def _default_of(fn: Any, name: str) -> Any:
    sig = _signature(fn)
    if sig is None or name not in sig.parameters:
        return None
    default = sig.parameters[name].default
    return None if default is inspect.Parameter.empty else default


def _hint(exc: BaseException) -> str:
    """Advice for the import errors people hit most."""
    text = str(exc)
    if "OffloadedCache" in text or "QuantizedCacheConfig" in text:
        return (
            "; upstream IndexTTS needs transformers==4.52.1 and this venv has a newer one "
            "(pip install transformers==4.52.1, or use the PyPI package indextts2-inference with transformers>=5)"
        )
    if "torch" in text:
        return "; install torch into this venv as upstream's pins ask (see docs/indextts.md)"
    return ""

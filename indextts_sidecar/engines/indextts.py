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

import gc
import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union

import msgspec

from ..protocol import EMOTION_NAMES, EmotionAudio, EmotionText, EmotionVector
from . import Cancelled, Engine, EngineError, LoadError, ProgressFn, RequestError, SynthesisRequest, heartbeat

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "CHECKPOINT_FILES",
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
    "find_flavour",
    "missing_checkpoints",
    "to_pcm16",
]

log = logging.getLogger(__name__)

#: IndexTTS-2 and 2.5 both emit 22050 Hz mono; this adapter never resamples.
NATIVE_SAMPLE_RATE = 22050
#: Files every checkpoint directory must hold (``glossary.yaml`` is optional).
CHECKPOINT_FILES = ("config.yaml", "bpe.model", "gpt.pth", "s2mel.pth", "wav2vec2bert_stats.pt", "feat1.pt", "feat2.pt")
#: The Qwen emotion model, needed only when ``use_qwen_emo`` is on (emotion from text).
QWEN_EMO_DIR = "qwen0.6bemo4-merge"
#: Languages IndexTTS-2.5 accepts in ``lang`` (case-insensitive).
LANGUAGES = ("zh", "en", "ja", "es", "ar", "zhen")
#: The distribution name of the PyPI repackaging.
PYPI_DISTRIBUTION = "indextts2-inference"
#: Streamed chunks louder than this cannot be on the [-1, 1] scale.
_UNIT_SCALE_CEILING = 4.0
#: Seconds between heartbeats while a long step runs (constructing, generating a segment).
HEARTBEAT_INTERVAL = 2.0
#: Tolerance of the emotion-vector sum rule (float rounding of weights like 0.1 + 0.2).
_SUM_TOLERANCE = 1e-6

_Lang = Annotated[str, msgspec.Meta(pattern=r"(?i)^(zh|en|ja|es|ar|zhen)$")]
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
    #: Upstream only: make the first segments shorter, for earlier first audio.
    more_segment_before: Union[_NonNegativeInt, None] = None
    #: PyPI repackaging only: its counterpart of ``more_segment_before``.
    quick_streaming_tokens: Union[_NonNegativeInt, None] = None
    # Sampling options of the GPT (upstream's ``generation_kwargs``).
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

    #: The text's language: zh, en, ja, es, ar, zhen; None uses the engine option ``lang``.
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
    "do_sample",
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
    """Which ``indextts`` is installed: ``kind`` is ``"2"``, ``"2.5"`` or ``"pypi"``."""

    kind: str
    #: The module holding ``IndexTTS2``.
    module: str
    #: Where the ``indextts`` package lives.
    location: Union[str, None]

    @property
    def label(self) -> str:
        return {"2": "IndexTTS-2", "2.5": "IndexTTS-2.5", "pypi": f"IndexTTS-2 from {PYPI_DISTRIBUTION}"}[self.kind]

    @property
    def engine(self) -> str:
        return "indextts2.5" if self.kind == "2.5" else "indextts2"

    @property
    def unit_scale(self) -> bool:
        """Streamed chunks are floats in [-1, 1] rather than on PCM scale."""
        return self.kind == "pypi"

    @property
    def qwen_emo_default(self) -> bool:
        return self.kind != "2.5"


def _package_dir() -> Union[str, None]:
    """The directory of the ``indextts`` package if one is installed (imports nothing)."""
    spec = importlib.util.find_spec("indextts")
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
    """The first installed flavour among ``prefer`` (``"2.5"``, ``"2"``), without importing torch.

    Looking for a submodule imports the ``indextts`` package itself (upstream's is empty),
    never the module holding the model.  Returns None when none of ``prefer`` is installed.
    """
    package_dir = _package_dir()
    if package_dir is None:
        return None
    modules = {"2.5": "indextts.infer_v2_5", "2": "indextts.infer_v2"}
    for kind in prefer:
        module = modules[kind]
        if importlib.util.find_spec(module) is None:
            continue
        if kind == "2" and _is_pypi(package_dir):
            kind = "pypi"
        return Flavour(kind=kind, module=module, location=package_dir)
    return None


def missing_checkpoints(model_dir: str, *, cfg_path: Union[str, None] = None, qwen_emo: bool = True) -> list[str]:
    """Every required checkpoint entry absent from ``model_dir``; folders end with ``/``.

    ``cfg_path``, when given, replaces ``<model_dir>/config.yaml`` and is reported by its path.
    """
    missing = []
    for name in CHECKPOINT_FILES:
        if name == "config.yaml" and cfg_path is not None:
            if not os.path.isfile(cfg_path):
                missing.append(cfg_path)
        elif not os.path.isfile(os.path.join(model_dir, name)):
            missing.append(name)
    if qwen_emo and not os.path.isdir(os.path.join(model_dir, QWEN_EMO_DIR)):
        missing.append(QWEN_EMO_DIR + "/")
    return missing


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
    """The adapter; subclasses choose the flavours they accept."""

    native_sample_rate = NATIVE_SAMPLE_RATE
    capabilities: ClassVar[tuple[str, ...]] = (
        "streaming",
        "voice_clone",
        "emotion_vector",
        "emotion_audio",
        "emotion_text",
    )
    #: Flavours this engine may load, in order of preference.
    _PREFER: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self._model: Any = None
        #: The flavour loaded (or last loaded); None before the first load.
        self.flavour: Union[Flavour, None] = None
        self._infer_params: frozenset[str] = frozenset()
        self._qwen_emo: Union[bool, None] = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    # ---------------------------------------------------------- check

    def check(self, request: SynthesisRequest[Any]) -> None:
        """Everything that needs no model, on the event loop thread."""
        if not request.text.strip():
            raise RequestError("text is empty", field="$.text")
        if request.voice is None:
            raise RequestError(
                "IndexTTS clones a voice: set voice to the path of a speaker reference clip", field="$.voice"
            )
        _check_readable(request.voice, "$.voice", "voice reference")
        emotion = request.emotion
        if isinstance(emotion, EmotionVector):
            _check_vector(emotion)
        elif isinstance(emotion, EmotionAudio):
            _check_readable(emotion.path, "$.emotion.path", "emotion reference")
            if not (math.isfinite(emotion.alpha) and 0.0 <= emotion.alpha <= 1.0):
                raise RequestError(f"emotion alpha must be in [0, 1], got {emotion.alpha}", field="$.emotion.alpha")
        elif isinstance(emotion, EmotionText) and not math.isfinite(emotion.alpha):
            raise RequestError(f"emotion alpha must be a finite number, got {emotion.alpha}", field="$.emotion.alpha")
        self._check_flavour(request)

    def _qwen_emo_enabled(self) -> Union[bool, None]:
        """Whether the Qwen emotion model is (or will be) loaded; None when not yet known."""
        if self.loaded:
            return self._qwen_emo
        if self.options.use_qwen_emo is not None:
            return bool(self.options.use_qwen_emo)
        if len(self._PREFER) == 1:
            return self._PREFER[0] != "2.5"
        return None

    def _check_flavour(self, request: SynthesisRequest[Any]) -> None:
        """Checks that depend on the installed flavour: skipped until it is known."""
        if isinstance(request.emotion, EmotionText) and self._qwen_emo_enabled() is False:
            raise RequestError(
                "emotion from text needs the Qwen emotion model, which this engine runs without: "
                f"start it with -o use_qwen_emo=true (and {QWEN_EMO_DIR}/ in the checkpoint directory)",
                field="$.emotion",
            )
        if not self.loaded or self.flavour is None:
            return
        for name in _INFER_KEYWORDS:
            if getattr(request.options, name, None) is not None and name not in self._infer_params:
                raise RequestError(
                    f"option {name!r} is not supported by the installed {self.flavour.label}",
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
        flavour = self._resolve_flavour()
        qwen_emo = opts.use_qwen_emo if opts.use_qwen_emo is not None else flavour.qwen_emo_default
        self._check_checkpoints(qwen_emo)
        if cancelled():
            raise Cancelled
        progress("load", 0.1, f"importing {flavour.module} ({flavour.label})")
        cls = self._import(flavour)
        if cancelled():
            raise Cancelled
        kwargs = self._constructor_kwargs(cls, flavour)
        self._infer_params = _named_parameters(cls.infer)
        if "quick_streaming_tokens" in self._infer_params and "more_segment_before" not in self._infer_params:
            flavour = Flavour(kind="pypi", module=flavour.module, location=flavour.location)
        if "use_qwen_emo" in kwargs:
            self._qwen_emo = bool(kwargs["use_qwen_emo"])
        else:
            default = _default_of(cls.__init__, "use_qwen_emo")
            self._qwen_emo = default if isinstance(default, bool) else None
        if self._qwen_emo and opts.use_qwen_emo is None and not qwen_emo:
            # The installed constructor turns it on where we assumed off: check for the folder now.
            self._check_checkpoints(True)
        lang = getattr(opts, "lang", None)
        if lang is not None and "lang" not in self._infer_params:
            self._drop("lang", flavour)
        log.info("constructing %s from %s with %s", flavour.label, flavour.module, kwargs)
        message = f"constructing {flavour.label} on {opts.device or 'the default device'}"
        progress("load", 0.3, message)
        with heartbeat(progress, "load", 0.3, message, HEARTBEAT_INTERVAL):
            model = cls(**kwargs)
        self._model = model
        self.flavour = flavour
        self.sample_rate = NATIVE_SAMPLE_RATE
        progress("load", 1.0, f"loaded {flavour.label}")
        if cancelled():  # the model stays loaded: the next request uses it
            raise Cancelled

    def _resolve_flavour(self) -> Flavour:
        try:
            flavour = find_flavour(self._PREFER)
        except ImportError as exc:
            raise LoadError(f"the indextts package is installed but fails to import: {exc}{_hint(exc)}") from exc
        if flavour is not None:
            return flavour
        package_dir = _package_dir()
        wanted = " or ".join({"2.5": "indextts.infer_v2_5", "2": "indextts.infer_v2"}[k] for k in self._PREFER)
        if package_dir is None:
            raise LoadError(
                f"indextts is not installed in this interpreter ({sys.executable}): install upstream IndexTTS "
                "into this venv (git clone https://github.com/index-tts/index-tts && pip install -e index-tts), "
                "see docs/indextts.md; `python -m indextts_sidecar --doctor` checks the set-up"
            )
        other = find_flavour(("2.5", "2"))
        found = f" (it holds {other.label}: use --engine {other.engine})" if other is not None else ""
        raise LoadError(f"the indextts package at {package_dir} has no {wanted}{found}")

    def _check_checkpoints(self, qwen_emo: bool) -> None:
        opts = self.options
        model_dir = opts.model_dir
        missing = missing_checkpoints(model_dir, cfg_path=opts.cfg_path, qwen_emo=qwen_emo)
        if not missing:
            return
        where = os.path.abspath(model_dir)
        state = "does not exist" if not os.path.isdir(model_dir) else "is incomplete"
        note = f" ({QWEN_EMO_DIR}/ is needed because use_qwen_emo is on)" if QWEN_EMO_DIR + "/" in missing else ""
        raise LoadError(
            f"checkpoint directory {where} {state}: missing {', '.join(missing)}{note}; download the model's "
            "checkpoints into it (e.g. `hf download IndexTeam/IndexTTS-2 --local-dir DIR`) and set -o model_dir=DIR",
            field="model_dir",
        )

    def _import(self, flavour: Flavour) -> Any:
        try:
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
        if open_ended:
            return kwargs
        options = {"model_dir": "model_dir", "cfg_path": "cfg_path", **_CONSTRUCTOR_KEYWORDS}
        for option, keyword in options.items():
            if keyword in kwargs and keyword not in accepted:
                del kwargs[keyword]
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
        progress("synthesize", 0.0, "synthesizing")
        with heartbeat(progress, "synthesize", 0.0, "preparing the references", HEARTBEAT_INTERVAL):
            result = model.infer(**kwargs)
        if result is None:  # empty text after normalization
            return
        if isinstance(result, tuple):
            rate, audio = result
            self._check_rate(rate)
            yield to_pcm16(audio, unit_scale=flavour.unit_scale and _peak(_as_numpy(audio)) <= _UNIT_SCALE_CEILING)
            progress("synthesize", 1.0, "done")
            return
        if isinstance(result, (str, bytes, os.PathLike)):
            raise EngineError(f"the model wrote a file ({result!r}) instead of returning audio", code="internal")
        yield from self._stream(iter(result), flavour, progress, cancelled)

    def _stream(
        self, chunks: Iterator[Any], flavour: Flavour, progress: ProgressFn, cancelled: Callable[[], bool]
    ) -> Iterator[Any]:
        unit_scale = flavour.unit_scale
        segments = 0
        samples = 0
        try:
            while True:
                if cancelled():
                    raise Cancelled
                with heartbeat(progress, "synthesize", None, f"generating segment {segments + 1}", HEARTBEAT_INTERVAL):
                    try:
                        chunk = next(chunks)
                    except StopIteration:
                        break
                if cancelled():
                    raise Cancelled
                array = _as_numpy(chunk)
                peak = _peak(array)
                if unit_scale and peak > _UNIT_SCALE_CEILING:
                    log.warning("%s streamed PCM-scale floats (peak %.0f); treating it as such", flavour.label, peak)
                    unit_scale = False
                pcm = to_pcm16(array, unit_scale=unit_scale)
                if not pcm.size:
                    continue
                samples += pcm.size
                if pcm.any():  # upstream follows each segment with a chunk of silence
                    segments += 1
                    progress(
                        "synthesize", None, f"segment {segments} ready ({samples / NATIVE_SAMPLE_RATE:.2f} s of audio)"
                    )
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
        kwargs.update(_emotion_kwargs(request.emotion))
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
    Options = IndexTTS25Options
    RequestOptions = IndexTTS25RequestOptions
    _PREFER = ("2.5",)


class IndexTTSAuto(_IndexTTSEngine):
    """Whichever IndexTTS is installed, 2.5 preferred, decided when the model loads."""

    name = "indextts"
    Options = IndexTTSAutoOptions
    RequestOptions = IndexTTS25RequestOptions
    _PREFER = ("2.5", "2")


# ------------------------------------------------------------------ helpers


def _check_readable(path: str, field: str, what: str) -> None:
    if not path:
        raise RequestError(f"{what} path is empty", field=field)
    if not os.path.exists(path):
        raise RequestError(f"{what} {path!r} does not exist", field=field)
    if not os.path.isfile(path):
        raise RequestError(f"{what} {path!r} is not a file", field=field)
    if not os.access(path, os.R_OK):
        raise RequestError(f"{what} {path!r} is not readable", field=field)


def _check_vector(emotion: EmotionVector) -> None:
    values = emotion.values()
    for name, value in zip(EMOTION_NAMES, values, strict=True):
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise RequestError(f"emotion weight {name} must be in [0, 1], got {value}", field=f"$.emotion.{name}")
    total = math.fsum(values)
    if total > 1.0 + _SUM_TOLERANCE:
        raise RequestError(
            f"emotion weights sum to {total:g}; the sum must be at most 1 (IndexTTS mixes "
            "vector + (1 - sum) * speaker, so a larger sum inverts the speaker's own emotion)",
            field="$.emotion",
        )
    if not math.isfinite(emotion.alpha):
        raise RequestError(f"emotion alpha must be a finite number, got {emotion.alpha}", field="$.emotion.alpha")


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def _emotion_kwargs(emotion: Any) -> dict[str, Any]:
    if isinstance(emotion, EmotionVector):
        return {"emo_vector": emotion.values(), "emo_alpha": _clamp01(emotion.alpha)}
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

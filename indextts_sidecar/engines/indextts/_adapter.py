"""The adapter: upstream's ``IndexTTS2`` class driven keyword by keyword, one engine for every flavour.

``indextts`` (and with it torch) is imported inside :meth:`IndexTTSEngine.load`, on the
sidecar's engine thread, after the sidecar has moved fd 1 out of the way of upstream's
prints; numpy is imported on first use.  Every call into the model happens on that one
engine thread: upstream's instance is not thread-safe, and nothing here starts a thread
that touches it (the heartbeat thread only reports progress).
"""

from __future__ import annotations

import gc
import importlib
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Union

from ...protocol import EmotionAudio, EmotionText, EmotionVector
from ...protocol.segments import segment_text_message
from .. import (
    BatchItem,
    Cancelled,
    Engine,
    EngineError,
    ItemDone,
    Join,
    LoadError,
    ProgressFn,
    RequestError,
    SynthesisRequest,
    heartbeat,
)
from ._batch_run import BatchRun, one_after_another, request_decoding, resolve_stages
from ._batched import Decoding, decoding, install, interceptable
from ._checks import check_readable, check_text, decoding_asked
from ._emotion import check_vector, emotion_kwargs
from ._install import (
    FLAVOUR_MODULES,
    PYPI25_DISTRIBUTION,
    PYPI_DISTRIBUTION,
    QWEN_EMO_DIR,
    Flavour,
    aux_paths,
    checkpoint_version,
    find_flavour,
    import_hint,
    installation_problem,
    missing_checkpoints,
    package_dir,
)
from ._options import CONSTRUCTOR_KEYWORDS, GENERATION_KEYWORDS, INFER_KEYWORDS
from ._pcm import UNIT_SCALE_CEILING, as_numpy, peak, to_pcm16
from ._prefix import install as install_prefix
from ._prefix_store import PrefixStore, PrefixTally
from ._profile import Knobs, apply_bf16, bf16_knob_problem, bf16_problem, check_knobs, knob_facts, request_knobs
from ._segments import SegmentTexts, first_length
from ._speedups import install as install_speedups
from ._stream import HEARTBEAT_INTERVAL, NATIVE_SAMPLE_RATE, check_rate, stream_segments, within
from ._upstream import (
    StageTimes,
    accelerated,
    default_of,
    device_memory,
    empty_caches,
    named_parameters,
    offline,
    openmp_waits,
    preserved_process_state,
    takes_var_keyword,
)
from ._voice_cache import VoiceCache

__all__ = ["HEARTBEAT_INTERVAL", "NATIVE_SAMPLE_RATE", "IndexTTSEngine"]

_CAPABILITIES = ("streaming", "voice_clone", "emotion_vector", "emotion_audio", "emotion_text")

# Named after the package, as before it was split: log lines and logging configs name it.
log = logging.getLogger("indextts_sidecar.engines.indextts")


class IndexTTSEngine(Engine[Any, Any]):
    """The adapter; subclasses choose the model versions they accept."""

    native_sample_rate = NATIVE_SAMPLE_RATE
    capabilities: ClassVar[tuple[str, ...]] = _CAPABILITIES
    #: Model versions this engine may load ("2", "2.5"); the checkpoint directory picks one.
    _PREFER: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def probe(cls) -> Union[str, None]:
        return installation_problem(cls._PREFER)

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self._model: Any = None
        #: The flavour loaded (or last loaded); None before the first load.
        self.flavour: Union[Flavour, None] = None
        self._infer_params: frozenset[str] = frozenset()
        self._qwen_emo: Union[bool, None] = None
        self._voices = VoiceCache(options.voice_cache)
        self._prefix = PrefixStore(options.prefix_cache, options.prefix_cache_bytes)  # _prefix.py
        self._request_facts: dict[str, Any] = {}
        #: What upstream's segmenter cut the current request into (see _segments.py).
        self._segment_texts = SegmentTexts()
        #: Why upstream's model calls cannot be intercepted (see _batched.py); None when they can.
        self._intercept_problem: Union[str, None] = None
        #: GPT weights in bfloat16 (``bf16_weights``, fast profile); OpenMP's waits (``openmp_waits``).
        self.bf16_weights = False
        self._no_bf16: Union[str, None] = "not loaded"  # why the device lacks bf16 products (bf16_s2mel)
        self.openmp: dict[str, str] = {}
        self.speedups: dict[str, dict[str, str]] = {}  # _speedups.py: each part "on", "off" or why not

    @property
    def max_batch(self) -> int:
        return int(self.options.max_batch)

    @property
    def joins_batches(self) -> bool:
        """``join_batches`` with ``max_batch`` 2 or more, unless ``use_accel`` (docs/indextts.md, "Batching")."""
        opts = self.options
        return bool(opts.join_batches) and self.max_batch >= 2 and not opts.use_accel

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
            "prefix_cache": self._prefix.stats(),
            "batch_stages": self.batch_stages(),
            "profile": self.options.profile,
            "bf16_weights": self.bf16_weights,
            "openmp": self.openmp,
            **self.speedups,
        }

    def batch_stages(self) -> str:
        """The engine option ``batch_stages`` resolved (``_batch_run.resolve_stages``)."""
        return resolve_stages(self.options.batch_stages, getattr(self._model, "device", None) or self.options.device)

    # ---------------------------------------------------------- check

    def check(self, request: SynthesisRequest[Any]) -> None:
        """Everything that needs no model, on the event loop thread."""
        check_text(request.text)
        if request.voice is None:
            raise RequestError(
                "IndexTTS clones a voice: set voice to the path of a speaker reference clip", field="$.voice"
            )
        check_readable(request.voice, "$.voice", "voice reference")
        emotion = request.emotion
        if isinstance(emotion, EmotionVector):
            check_vector(emotion, normalize=self._normalize_emotion(request))
        elif isinstance(emotion, EmotionAudio):
            check_readable(emotion.path, "$.emotion.path", "emotion reference")
            if not (math.isfinite(emotion.alpha) and 0.0 <= emotion.alpha <= 1.0):
                raise RequestError(f"emotion alpha must be in [0, 1], got {emotion.alpha}", field="$.emotion.alpha")
        elif isinstance(emotion, EmotionText) and not math.isfinite(emotion.alpha):
            raise RequestError(f"emotion alpha must be a finite number, got {emotion.alpha}", field="$.emotion.alpha")
        self._check_flavour(request)

    def request_facts(self) -> dict[str, Any]:
        facts, self._request_facts = self._request_facts, {}
        if isinstance(tally := facts.get("prefix_cache"), PrefixTally):
            facts["prefix_cache"] = tally.facts()  # a lone request's, filled as it ran
        return facts

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
        for name in INFER_KEYWORDS:
            if getattr(options, name, None) is not None and name not in self._infer_params:
                raise RequestError(
                    f"option {name!r} is not supported by the installed {self.flavour.label}",
                    field=f"$.options.{name}",
                    code="unknown_option",
                )
        if decoding_asked(options) and self._intercept_problem is not None:
            name = "do_sample" if getattr(options, "do_sample", None) is False else "seed"
            raise RequestError(
                f"option {name!r} needs the adapter to reach upstream's model calls, which it cannot with "
                f"the installed {self.flavour.label}: {self._intercept_problem}",
                field=f"$.options.{name}",
                code="unknown_option",
            )
        check_knobs(self.options, options, self._intercept_problem, self.flavour.label, self._no_bf16)
        if accelerated(self._model):
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
        self.openmp = openmp_waits()  # before anything that may import torch
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
        bf16_problem(self.options, None, flavour.label)  # an explicit bf16_weights the device cannot honour
        self._no_bf16 = bf16_knob_problem(self.options)  # likewise bf16_s2mel, bf16_vocoder
        self._infer_params = named_parameters(cls.infer_generator if flavour.streams_with_generator else cls.infer)
        if "use_qwen_emo" in kwargs:
            self._qwen_emo = bool(kwargs["use_qwen_emo"])
        elif flavour.kind == "pypi":
            self._qwen_emo = True
        else:
            default = default_of(cls.__init__, "use_qwen_emo")
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
        with heartbeat(progress, "load", 0.3, message, HEARTBEAT_INTERVAL), offline(not opts.allow_download):
            model = cls(**kwargs)
        self._segment_texts.install(model)
        self.bf16_weights = apply_bf16(self.options, model, flavour.label)
        self.speedups = install_speedups(model, opts)
        self._intercept_problem = interceptable(model)
        self._prefix.clear(install_prefix(model, self._prefix))
        if self._intercept_problem is not None and opts.max_batch > 1:
            log.warning("batches run one request after another, none joining: %s", self._intercept_problem)
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
            raise LoadError(f"the indextts package is installed but fails to import: {exc}{import_hint(exc)}") from exc
        if flavour is not None:
            return flavour
        modules = " or ".join(module for module, _ in FLAVOUR_MODULES[version])
        other = find_flavour(("2.5", "2"))
        if other is None and package_dir() is None and package_dir("indextts25") is None:
            raise LoadError(
                f"IndexTTS is not installed in this interpreter ({sys.executable}): install upstream IndexTTS "
                "into this venv (git clone https://github.com/index-tts/index-tts && pip install -e index-tts), "
                f"or the PyPI package {PYPI25_DISTRIBUTION if version == '2.5' else PYPI_DISTRIBUTION}; "
                "see the IndexTTS set-up guide (docs/indextts.md in the source repository); `python -m "
                "indextts_sidecar --doctor` checks the set-up"
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
            with preserved_process_state():
                module = importlib.import_module(flavour.module)
        except ImportError as exc:
            raise LoadError(
                f"importing {flavour.module} failed: {type(exc).__name__}: {exc}{import_hint(exc)}"
            ) from exc
        cls = getattr(module, "IndexTTS2", None)
        if cls is None:
            raise LoadError(f"{flavour.module} has no IndexTTS2 class: an unsupported indextts version")
        return cls

    def _constructor_kwargs(self, cls: Any, flavour: Flavour) -> dict[str, Any]:
        """Keyword arguments for the constructor; options it does not accept are dropped and recorded."""
        opts = self.options
        accepted = named_parameters(cls.__init__)
        open_ended = takes_var_keyword(cls.__init__)
        kwargs: dict[str, Any] = {
            "model_dir": opts.model_dir,
            "cfg_path": opts.cfg_path if opts.cfg_path is not None else os.path.join(opts.model_dir, "config.yaml"),
        }
        for option, keyword in CONSTRUCTOR_KEYWORDS.items():
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
            kwargs["aux_paths"] = aux_paths(opts.model_dir)
        if open_ended:
            return kwargs
        options = {"model_dir": "model_dir", "cfg_path": "cfg_path", "aux_paths": "aux_paths", **CONSTRUCTOR_KEYWORDS}
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
        context = self._decoding(request)
        if context is not None:
            install(model)
        restored = self._voices.restore(model, voice)
        times = StageTimes()
        self._request_facts = {"voice_cache": "hit" if restored else "miss", "stages": times.stages}
        self._request_facts["prefix_cache"] = self._prefix.start()
        self._request_facts.update(self.knob_facts(request))
        self._segment_texts.start(first_length(request.options, self.options, request.stream))
        emotion_path = kwargs.get("emo_audio_prompt")
        with (
            heartbeat(progress, "prepare", None, "preparing the references", HEARTBEAT_INTERVAL),
            times.capturing(),
            decoding(context),
        ):
            call = model.infer_generator if flavour.streams_with_generator else model.infer
            result = call(**kwargs)
        if isinstance(result, tuple):
            rate, audio = result
            check_rate(rate)
            if self._segment_texts.texts:  # one chunk speaks every segment
                progress("synthesize", None, segment_text_message(" ".join(self._segment_texts.texts)))
            yield to_pcm16(audio, unit_scale=flavour.unit_scale and peak(as_numpy(audio)) <= UNIT_SCALE_CEILING)
            progress("synthesize", 1.0, "done")
            return
        if result is None or isinstance(result, (str, bytes, os.PathLike)):
            raise EngineError(f"the model returned {result!r} instead of audio", code="internal")

        def remember() -> None:
            if not restored:
                self._voices.remember(model, voice, emotion_path)

        chunks = iter(result) if context is None else within(context, iter(result))
        yield from stream_segments(
            chunks, flavour, self._segment_texts, progress, cancelled, remember, (voice, emotion_path), times
        )

    def _decoding(self, request: SynthesisRequest[Any]) -> Union[Decoding, None]:
        """How a lone ``request`` decodes when it is not upstream's own way (None: upstream's own way)."""
        knobs = self.knobs(request)
        if not (decoding_asked(request.options) or knobs.s2mel):
            return None
        return self.decoding_of(request)

    def decoding_of(self, request: SynthesisRequest[Any], **batch: Any) -> Decoding:
        """``request``'s decoding context, its knobs in it (and ``batch``'s fields)."""
        return request_decoding(request, self.knobs(request), **batch)

    def knobs(self, request: SynthesisRequest[Any]) -> Knobs:
        """The fast profile's knobs in effect for ``request`` (``_profile.py``)."""
        return request_knobs(self.options, request.options, accelerated(self._model), not self._no_bf16)[1]

    def knob_facts(self, request: SynthesisRequest[Any]) -> dict[str, Any]:
        """What ``done.facts`` says of the profile (``_profile.py``)."""
        return knob_facts(self.options, request.options, accelerated(self._model), self.bf16_weights, not self._no_bf16)

    # ---------------------------------------------------------- batches

    def synthesize_batch(
        self, items: Sequence[BatchItem[Any]], join: Union[Join, None] = None
    ) -> Iterator[tuple[int, Union[Any, ItemDone]]]:
        """Several requests at once: upstream's generators in lockstep, their model calls batched.

        See _batched.py and _lockstep.py; ``join`` hands the running batch the requests that
        join it (_batch_run.py).  Where upstream's calls cannot be intercepted, the requests
        run one after another through :meth:`synthesize`, and none joins.
        """
        model = self._model
        flavour = self.flavour
        if model is None or flavour is None:
            raise EngineError("synthesize called before load", code="internal")
        if self._intercept_problem is not None:
            yield from one_after_another(self.synthesize, items)
            return
        hooks = install(model)
        batch = BatchRun(
            model,
            flavour,
            items,
            prepare=self._batch_kwargs,
            voices=self._voices,
            segment_texts=self._segment_texts,
            batch_vocoder=bool(self.options.batch_vocoder),
            max_batch=self.max_batch,
            join=join,
            batch_stages=self.batch_stages(),
            first_segment_tokens=lambda request: first_length(request.options, self.options, request.stream),
            decoding=self.decoding_of,
            facts=self.knob_facts,
        )
        try:
            for index, value in batch.run(hooks):
                if isinstance(value, ItemDone) and value.error is None:
                    # Its done's facts, for a request_facts() right after it (as after synthesize).
                    self._request_facts = batch.facts(index)
                yield index, value
        finally:
            batch.close()

    def _batch_kwargs(self, request: SynthesisRequest[Any]) -> dict[str, Any]:
        """What a request of a batch passes to ``infer``; a RequestError fails it alone."""
        self._check_flavour(request)
        return self._infer_kwargs(request)

    def _infer_kwargs(self, request: SynthesisRequest[Any]) -> dict[str, Any]:
        """The exact keyword arguments of ``infer`` for ``request``."""
        params = self._infer_params
        kwargs: dict[str, Any] = {"spk_audio_prompt": request.voice, "text": request.text, "output_path": None}
        if "stream_return" in params:
            kwargs["stream_return"] = True
        kwargs.update(emotion_kwargs(request.emotion, normalize=self._normalize_emotion(request)))
        opts = request.options
        for name in INFER_KEYWORDS:
            value = getattr(opts, name, None)
            if value is not None:
                kwargs[name] = value
        if "lang" in params:
            lang = kwargs.get("lang") or getattr(self.options, "lang", None) or "en"
            kwargs["lang"] = str(lang).lower()
        for name in GENERATION_KEYWORDS:
            value = getattr(opts, name, None)
            if value is not None:
                kwargs[name] = value
        beams = self.knobs(request).num_beams
        if beams is not None:
            kwargs["num_beams"] = beams
        return kwargs

    # ---------------------------------------------------------- memory

    def unload(self) -> None:
        if self._model is None:
            return
        self._model = None
        self._voices.clear()
        self._prefix.clear()
        gc.collect()
        empty_caches()

    def memory(self) -> dict[str, int]:
        """CUDA or MPS memory, only if torch is already imported (never imports it); the prefix cache's."""
        return {**device_memory(), **self._prefix.health()}

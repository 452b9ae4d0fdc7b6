"""The IndexTTS engines' options: engine options (the sidecar's ``-o``), per-request options,
and which upstream keyword each becomes.  None leaves upstream's own default in place.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

import msgspec

__all__ = [
    "CONSTRUCTOR_KEYWORDS",
    "GENERATION_KEYWORDS",
    "INFER_KEYWORDS",
    "LANGUAGES",
    "MAX_BATCH_LIMIT",
    "MAX_DIFFUSION_STEPS",
    "PREFIX_CACHE_BYTES_DEFAULT",
    "PREFIX_CACHE_DEFAULT",
    "PROFILES",
    "VOICE_CACHE_DEFAULT",
    "IndexTTS2Options",
    "IndexTTS2RequestOptions",
    "IndexTTS25Options",
    "IndexTTS25RequestOptions",
    "IndexTTSAutoOptions",
]

#: Languages IndexTTS-2.5 speaks (upstream's web UI offers exactly these).  Each is a
#: language token of upstream's tokenizer; anything else would go in as literal text.
LANGUAGES = ("zh", "en", "ja", "es", "ar")
#: Reference conditionings kept per engine by default (``voice_cache`` engine option).
VOICE_CACHE_DEFAULT = 4
#: Voice prefixes (conditioning and the GPT's keys and values over it) kept by default
#: (``prefix_cache``), and the bytes they may hold together (``prefix_cache_bytes``).
PREFIX_CACHE_DEFAULT = 8
PREFIX_CACHE_BYTES_DEFAULT = 256 * 2**20
#: The largest ``max_batch`` accepted (upstream's accel engine plans for 8 sequences; 64 bounds memory).
MAX_BATCH_LIMIT = 64

#: The most s2mel diffusion steps a request may ask for (upstream runs 25).
MAX_DIFFUSION_STEPS = 200
#: ``profile``: ``default`` is upstream's path; ``fast`` sets the knobs of ``PROFILES["fast"]``
#: (docs/indextts.md, "The fast profile").
PROFILES = ("default", "fast")

_Lang = Annotated[str, msgspec.Meta(pattern=r"(?i)^(zh|en|ja|es|ar)$")]
_NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
_PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
_Profile = Literal["default", "fast"]
_Steps = Annotated[int, msgspec.Meta(ge=1, le=MAX_DIFFUSION_STEPS)]
#: Upstream's classifier-free guidance rate (0.7); 0 turns guidance off (one DiT row, not two).
_CfgRate = Annotated[float, msgspec.Meta(ge=0, le=10)]


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
    #: Voice prefixes kept: a voice's emotion vector and speaker latents, and the GPT's keys and
    #: values over its conditioning positions, reused by the next request with the same voice
    #: (docs/indextts.md, "Voice prefix cache").  0 turns the cache off.
    prefix_cache: _NonNegativeInt = PREFIX_CACHE_DEFAULT
    #: The bytes the prefix cache may hold in all (least recently used first out); 0: off.
    prefix_cache_bytes: _NonNegativeInt = PREFIX_CACHE_BYTES_DEFAULT
    #: Scale emotion vectors as upstream's web UI does (per-emotion bias, sum capped at 0.8)
    #: unless a request says otherwise, so a vector sounds the same as there.
    normalize_emotion: bool = True
    #: Requests decoded together at most: the sidecar hands this engine up to this many
    #: concurrent requests at once (docs/indextts.md, "Batching").  1: one at a time, through
    #: upstream's own ``infer`` unchanged.
    max_batch: Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH_LIMIT)] = 1
    #: In a batch, run the vocoder (BigVGAN) on the rows of equal length together, rather
    #: than one request at a time.
    batch_vocoder: bool = True
    #: Which stages of a batch run batched: ``gpt`` batches the GPT's decoding and runs its
    #: latent pass, the s2mel CFM and the vocoder one request at a time, as each request's
    #: codes are ready, so that its audio leaves as soon as its own work is done; ``all``
    #: batches every stage; ``auto``: ``gpt`` on a CPU (where the CFM is compute-bound at one
    #: row), ``all`` on other devices (docs/indextts.md, "Batching").
    batch_stages: Literal["auto", "gpt", "all"] = "auto"
    #: The first segment of every request cut at this many text tokens (at a word boundary), so
    #: that streamed audio starts after a few words: the default of the request option of the
    #: same name.  None: 10 for a streaming request (``STREAM_FIRST_SEGMENT_TOKENS``), upstream's
    #: segments for the others; 0: upstream's segments for every request.
    first_segment_tokens: Union[_NonNegativeInt, None] = None
    #: Continuous batching: requests that arrive while a batch runs join it at its next step
    #: instead of waiting for its end, and a lone request runs as a batch of one.  Effective
    #: only with ``max_batch`` 2 or more and upstream's model calls reachable (not with
    #: ``use_accel``, nor an upstream whose calls cannot be intercepted: the warning at load).
    join_batches: bool = True
    #: ``fast``: the fast profile's knobs for every request (docs/indextts.md, "The fast
    #: profile"); each knob below, set, overrides the profile's value.  ``default``: none.
    profile: _Profile = "default"
    #: s2mel diffusion steps (upstream's ``diffusion_steps``, 25); None: the profile's.
    diffusion_steps: Union[_Steps, None] = None
    #: s2mel classifier-free guidance rate (upstream's ``inference_cfg_rate``, 0.7); 0: off.
    cfg_rate: Union[_CfgRate, None] = None
    #: GPT beams of every request that does not set its own (upstream's default, 3).
    num_beams: Union[_PositiveInt, None] = None
    #: The GPT's weights in bfloat16, where the device has bf16 matrix products (a CPU with
    #: AVX512-BF16 or AMX, a CUDA GPU with bf16): refused at load, named, elsewhere.
    bf16_weights: Union[bool, None] = None
    #: The s2mel decoder (its DiT and WaveNet) under bfloat16 autocast, for every request that
    #: does not set its own; None: the profile's (``fast``: on where the device has bf16 matrix
    #: products).  Explicitly on where the device has none: refused at load, named.
    bf16_s2mel: Union[bool, None] = None
    #: The vocoder's dense convolutions of 96 channels or more in bfloat16; None and refusal as
    #: ``bf16_s2mel``.
    bf16_vocoder: Union[bool, None] = None
    #: The GPT's same-output speed-ups where they apply (docs/indextts.md, "The same output,
    #: faster"): its linear layers in oneDNN's layout on a CPU (in float32, or in bfloat16 under
    #: ``bf16_weights``), and a key-value cache that grows in place and moves only the beams
    #: that changed.  False: upstream's path as is.
    gpt_speedups: bool = True
    #: s2mel's same-output speed-ups (the same section): the DiT's tail over the new frames only,
    #: and its weight norm computed once.  False: upstream's path as is.
    s2mel_speedups: bool = True


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
    #: Cut the first segment at this many text tokens (a word boundary; the rest of it stays one
    #: segment), for earlier first audio, with every flavour; 0: upstream's segments; None: the
    #: engine option (unset there: 10 when the request streams).
    first_segment_tokens: Union[_NonNegativeInt, None] = None
    #: Scale an emotion vector as upstream's web UI does; None: the engine option.
    normalize_emotion: Union[bool, None] = None
    # Sampling options of the GPT (upstream's ``generation_kwargs``).
    #: False: greedy decoding (one beam unless ``num_beams`` says more), which upstream's
    #: ``infer`` cannot do (it pops ``do_sample`` and passes True); None or True: upstream's sampling.
    do_sample: Union[bool, None] = None
    #: The seed of this request's own noise generator for the s2mel decoder: with greedy
    #: decoding, the same request gives the same audio, alone or in a batch.
    seed: Union[Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)], None] = None
    temperature: Union[_PositiveFloat, None] = None
    top_p: Union[Annotated[float, msgspec.Meta(gt=0, le=1)], None] = None
    top_k: Union[_NonNegativeInt, None] = None
    num_beams: Union[_PositiveInt, None] = None
    repetition_penalty: Union[_PositiveFloat, None] = None
    length_penalty: Union[float, None] = None
    max_mel_tokens: Union[_PositiveInt, None] = None
    #: The fast profile's knobs for this request (``fast``), or none of them (``default``);
    #: None: the engine option.  ``bf16_weights`` is the engine's alone (weights load once).
    profile: Union[_Profile, None] = None
    #: s2mel diffusion steps (upstream: 25); None: the profile's, else the engine option.
    diffusion_steps: Union[_Steps, None] = None
    #: s2mel classifier-free guidance rate (upstream: 0.7; 0: off); None as ``diffusion_steps``.
    cfg_rate: Union[_CfgRate, None] = None
    #: The s2mel decoder under bfloat16 autocast; None as ``diffusion_steps``.  True where the
    #: device has no bf16 matrix products: refused (``invalid_option``).
    bf16_s2mel: Union[bool, None] = None
    #: The vocoder's dense convolutions of 96 channels or more in bfloat16; as ``bf16_s2mel``.
    bf16_vocoder: Union[bool, None] = None

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
CONSTRUCTOR_KEYWORDS = {
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
INFER_KEYWORDS = (
    "use_random",
    "interval_silence",
    "max_text_tokens_per_segment",
    "more_segment_before",
    "quick_streaming_tokens",
    "lang",
    "duration_factor",
    "text_normalization",
)
#: Request options for upstream's sampler (its ``generation_kwargs``).
GENERATION_KEYWORDS = (
    "temperature",
    "top_p",
    "top_k",
    "num_beams",
    "repetition_penalty",
    "length_penalty",
    "max_mel_tokens",
)

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

The package imports only the standard library and msgspec; see :mod:`._adapter` for when
torch and numpy are imported.  Its modules:

``_install``
    the flavours of upstream code and the checkpoint files (shared with the doctor);
``_options``
    engine and request options, and the upstream keyword each becomes;
``_profile``, ``_precision``
    the fast profile: its knobs in effect for a request, and whether the device has bf16; the
    bfloat16 regions around the s2mel solve and the vocoder (``bf16_s2mel``, ``bf16_vocoder``);
``_adapter``
    the engine: checks, load, synthesize, memory;
``_checks``
    a request's cheap checks before it is queued: text upstream can speak, readable clips;
``_stream``, ``_segments``
    upstream's stream read segment by segment (``Tally``, for a lone request and each request
    of a batch alike), and the text span of each segment upstream cuts;
``_lockstep``, ``_batched``, ``_batch_run``
    batches: upstream's generators stepped in lockstep, its three model calls intercepted on
    the loaded instance and run together, and the batch's coordinator (requests join it);
``_prefix``, ``_prefix_store``
    the voice prefix cache: a voice's emotion vector, speaker latents and the GPT's keys and
    values over its conditioning, kept (bounded in entries and bytes) and reused;
``_gpt_fast``, ``_s2mel_fast``, ``_speedups``
    the same-output speed-ups: the GPT's linear layers in oneDNN's layout on a CPU and a beam
    search cache that grows in place and moves only the beams that changed; s2mel's DiT tail
    over the new frames only and its weight norm computed once; both put on at load;
``_emotion``, ``_pcm``, ``_voice_cache``, ``_upstream``
    emotion mapping, int16 conversion, the voice conditioning cache, and the guards and
    introspection that living with upstream's code in this process needs.

See docs/indextts.md for the set-up, the option tables and the emotion semantics.
"""

from __future__ import annotations

from .. import SpeedControl
from ._adapter import HEARTBEAT_INTERVAL, NATIVE_SAMPLE_RATE, IndexTTSEngine
from ._emotion import EMOTION_BIAS, EMOTION_SUM_CAP, emotion_weights
from ._install import (
    AUX_FILES,
    AUX_FILES_25,
    CHECKPOINT_FILES,
    CHECKPOINT_FILES_25,
    PYPI25_DISTRIBUTION,
    PYPI_DISTRIBUTION,
    QWEN_EMO_DIR,
    TIKTOKEN_FILE,
    Flavour,
    checkpoint_version,
    find_flavour,
    missing_checkpoints,
)
from ._options import (
    LANGUAGES,
    VOICE_CACHE_DEFAULT,
    IndexTTS2Options,
    IndexTTS2RequestOptions,
    IndexTTS25Options,
    IndexTTS25RequestOptions,
    IndexTTSAutoOptions,
)
from ._pcm import to_pcm16
from ._voice_cache import (
    EMOTION_CACHE_ATTRIBUTE,
    EMOTION_KEY_ATTRIBUTE,
    SPEAKER_CACHE_ATTRIBUTES,
    SPEAKER_KEY_ATTRIBUTE,
)

__all__ = [
    "AUX_FILES",
    "AUX_FILES_25",
    "CHECKPOINT_FILES",
    "CHECKPOINT_FILES_25",
    "EMOTION_BIAS",
    "EMOTION_CACHE_ATTRIBUTE",
    "EMOTION_KEY_ATTRIBUTE",
    "EMOTION_SUM_CAP",
    "HEARTBEAT_INTERVAL",
    "LANGUAGES",
    "NATIVE_SAMPLE_RATE",
    "PYPI25_DISTRIBUTION",
    "PYPI_DISTRIBUTION",
    "QWEN_EMO_DIR",
    "SPEAKER_CACHE_ATTRIBUTES",
    "SPEAKER_KEY_ATTRIBUTE",
    "TIKTOKEN_FILE",
    "VOICE_CACHE_DEFAULT",
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


class IndexTTS2Engine(IndexTTSEngine):
    """IndexTTS-2 (upstream's ``indextts.infer_v2``, or the PyPI repackaging)."""

    name = "indextts2"
    Options = IndexTTS2Options
    RequestOptions = IndexTTS2RequestOptions
    _PREFER = ("2",)


class IndexTTS25Engine(IndexTTSEngine):
    """IndexTTS-2.5 (upstream's ``indextts.infer_v2_5``)."""

    name = "indextts2.5"
    capabilities = (*IndexTTSEngine.capabilities, "lang", "duration")
    speed = SpeedControl(option="duration_factor", normal=1.0, minimum=0.5, maximum=2.0, inverse=True)
    Options = IndexTTS25Options
    RequestOptions = IndexTTS25RequestOptions
    _PREFER = ("2.5",)


class IndexTTSAuto(IndexTTSEngine):
    """IndexTTS-2 or 2.5, as the checkpoint directory says (its config's ``version``, its files)."""

    name = "indextts"
    Options = IndexTTSAutoOptions
    RequestOptions = IndexTTS25RequestOptions
    _PREFER = ("2", "2.5")

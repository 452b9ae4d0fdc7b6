"""Stand-in for upstream ``indextts/infer_v2_5.py`` (IndexTTS-2.5): upstream's exact signatures, no model.

As upstream: ``lang`` is required (anything but zh, en, ja, es, ar goes to the "common"
embedding), ``more_segment_before`` reaches ``quick_streaming_tokens``, which 2.5 never reads,
and the auxiliary models come from ``<model_dir>/hf_cache`` (no ``aux_paths``).

INDEXTTS_STANDIN_V25_VARIANT=gpt_latent selects the constructor of the other upstream commit
(``cfg_path="configs/config_v2_5.yaml"`` and ``use_gpt_latent`` before ``use_cuda_kernel``).
"""

import os

os.environ["HF_HUB_CACHE"] = "./checkpoints/hf_cache"  # upstream's first statement, relative to the cwd
import warnings

try:
    import torch  # noqa: F401
except ImportError:
    pass

from ._standin import core

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)
print(">> stand-in indextts.infer_v2_5 imported")
core.record("imported", module=__name__, hf_hub_cache=os.environ.get("HF_HUB_CACHE"))


class _IndexTTS25:
    FLAVOUR = "2.5"

    def split_text_by_tokens(self, text, max_tokens, lang_prefix=""):
        return core.split_text_by_tokens(text, max_tokens, lang_prefix)

    @core.recorded
    def infer(self, spk_audio_prompt, text, output_path, lang, emo_audio_prompt=None, emo_alpha=1.0,
              emo_vector=None, use_emo_text=False, emo_text=None, use_random=False, interval_silence=200,
              verbose=False, max_text_tokens_per_segment=120, stream_return=False, more_segment_before=0,
              duration_factor=1.0, text_normalization=True, **generation_kwargs):
        lang.lower()  # upstream lower-cases it (a non-string fails)
        return core.infer(
            self, spk_audio_prompt=spk_audio_prompt, text=text, output_path=output_path,
            emo_audio_prompt=emo_audio_prompt, emo_alpha=emo_alpha, emo_vector=emo_vector, use_emo_text=use_emo_text,
            emo_text=emo_text, interval_silence=interval_silence,
            max_text_tokens_per_segment=max_text_tokens_per_segment, stream_return=stream_return,
            first_tokens=0, unit_scale=False, generation_kwargs=generation_kwargs,
        )

    @core.recorded
    def infer_generator(self, spk_audio_prompt, text, output_path, lang, emo_audio_prompt=None, emo_alpha=1.0,
                        emo_vector=None, use_emo_text=False, emo_text=None, use_random=False, interval_silence=200,
                        verbose=False, max_text_tokens_per_segment=120, stream_return=False, quick_streaming_tokens=0,
                        duration_factor=1.0, text_normalization=True, **generation_kwargs):
        return core.infer_generator(
            self, spk_audio_prompt=spk_audio_prompt, text=text, output_path=output_path,
            emo_audio_prompt=emo_audio_prompt, emo_alpha=emo_alpha, emo_vector=emo_vector, use_emo_text=use_emo_text,
            emo_text=emo_text, interval_silence=interval_silence,
            max_text_tokens_per_segment=max_text_tokens_per_segment, stream_return=stream_return,
            first_tokens=0, unit_scale=False, generation_kwargs=generation_kwargs,
        )


class _Plain(_IndexTTS25):
    @core.recorded
    def __init__(self, cfg_path="checkpoints/config.yaml", model_dir="checkpoints", use_bf16=False, device=None,
                 use_cuda_kernel=None, use_deepspeed=False, use_accel=False, use_torch_compile=False,
                 use_qwen_emo=False):
        core.construct(self, cfg_path=cfg_path, model_dir=model_dir, use_qwen_emo=use_qwen_emo, use_accel=use_accel,
                       version="2.5", aux=core.AUX_25)


class _GptLatent(_IndexTTS25):
    @core.recorded
    def __init__(self, cfg_path="configs/config_v2_5.yaml", model_dir="checkpoints", use_bf16=False, device=None,
                 use_gpt_latent=False, use_cuda_kernel=None, use_deepspeed=False, use_accel=False,
                 use_torch_compile=False, use_qwen_emo=False):
        core.construct(self, cfg_path=cfg_path, model_dir=model_dir, use_qwen_emo=use_qwen_emo, use_accel=use_accel,
                       version="2.5", aux=core.AUX_25)


IndexTTS2 = _GptLatent if os.environ.get("INDEXTTS_STANDIN_V25_VARIANT") == "gpt_latent" else _Plain
IndexTTS2.__name__ = IndexTTS2.__qualname__ = "IndexTTS2"

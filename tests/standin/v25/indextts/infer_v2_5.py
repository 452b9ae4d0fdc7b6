"""Stand-in for upstream ``indextts/infer_v2_5.py`` (IndexTTS-2.5): upstream's exact signatures, no model.

INDEXTTS_STANDIN_V25_VARIANT=gpt_latent selects the constructor of the other upstream commit
(``cfg_path="configs/config_v2_5.yaml"`` and ``use_gpt_latent`` before ``use_cuda_kernel``).
"""

import os

try:
    import torch  # noqa: F401
except ImportError:
    pass

from ._standin import core

print(">> stand-in indextts.infer_v2_5 imported")

_LANGS = {"zh", "en", "ja", "es", "ar", "zhen"}


class _IndexTTS25:
    FLAVOUR = "2.5"

    @core.recorded
    def infer(self, spk_audio_prompt, text, output_path, lang, emo_audio_prompt=None, emo_alpha=1.0,
              emo_vector=None, use_emo_text=False, emo_text=None, use_random=False, interval_silence=200,
              verbose=False, max_text_tokens_per_segment=120, stream_return=False, more_segment_before=0,
              duration_factor=1.0, text_normalization=True, **generation_kwargs):
        if use_emo_text and not self.use_qwen_emo:
            raise RuntimeError("Qwen emotion model is not loaded: construct with use_qwen_emo=True")
        lang = lang.lower() if lang.lower() in _LANGS else "common"
        return core.infer(
            self, spk_audio_prompt=spk_audio_prompt, text=text, output_path=output_path,
            emo_audio_prompt=emo_audio_prompt, emo_alpha=emo_alpha, emo_vector=emo_vector, use_emo_text=use_emo_text,
            emo_text=emo_text, interval_silence=interval_silence,
            max_text_tokens_per_segment=max_text_tokens_per_segment, stream_return=stream_return,
            first_tokens=more_segment_before, unit_scale=False,
        )


class _Plain(_IndexTTS25):
    @core.recorded
    def __init__(self, cfg_path="checkpoints/config.yaml", model_dir="checkpoints", use_bf16=False, device=None,
                 use_cuda_kernel=None, use_deepspeed=False, use_accel=False, use_torch_compile=False,
                 use_qwen_emo=False):
        core.construct(self, cfg_path, model_dir, use_qwen_emo)


class _GptLatent(_IndexTTS25):
    @core.recorded
    def __init__(self, cfg_path="configs/config_v2_5.yaml", model_dir="checkpoints", use_bf16=False, device=None,
                 use_gpt_latent=False, use_cuda_kernel=None, use_deepspeed=False, use_accel=False,
                 use_torch_compile=False, use_qwen_emo=False):
        core.construct(self, cfg_path, model_dir, use_qwen_emo)


IndexTTS2 = _GptLatent if os.environ.get("INDEXTTS_STANDIN_V25_VARIANT") == "gpt_latent" else _Plain
IndexTTS2.__name__ = IndexTTS2.__qualname__ = "IndexTTS2"

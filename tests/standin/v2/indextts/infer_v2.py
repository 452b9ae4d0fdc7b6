"""Stand-in for upstream ``indextts/infer_v2.py`` (IndexTTS-2): upstream's exact signatures, no model."""

try:
    import torch  # noqa: F401  (upstream imports torch here; the stub in ../torchstub when on the path)
except ImportError:
    pass

import warnings

from ._standin import core

# Upstream's import side effects: warning filters for the whole process.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)
print(">> stand-in indextts.infer_v2 imported")
core.record("imported", module=__name__)


class IndexTTS2:
    FLAVOUR = "2"

    @core.recorded
    def __init__(self, cfg_path="checkpoints/config.yaml", model_dir="checkpoints", use_fp16=False, device=None,
                 use_cuda_kernel=None, use_deepspeed=False, use_accel=False, use_torch_compile=False,
                 use_qwen_emo=True, aux_paths=None):
        core.construct(self, cfg_path=cfg_path, model_dir=model_dir, use_qwen_emo=use_qwen_emo, use_accel=use_accel,
                       version="2", aux=core.AUX_2, aux_paths=aux_paths)

    @core.recorded
    def infer(self, spk_audio_prompt, text, output_path, emo_audio_prompt=None, emo_alpha=1.0, emo_vector=None,
              use_emo_text=False, emo_text=None, use_random=False, interval_silence=200, verbose=False,
              max_text_tokens_per_segment=120, stream_return=False, more_segment_before=0, **generation_kwargs):
        return core.infer(
            self, spk_audio_prompt=spk_audio_prompt, text=text, output_path=output_path,
            emo_audio_prompt=emo_audio_prompt, emo_alpha=emo_alpha, emo_vector=emo_vector, use_emo_text=use_emo_text,
            emo_text=emo_text, interval_silence=interval_silence,
            max_text_tokens_per_segment=max_text_tokens_per_segment, stream_return=stream_return,
            first_tokens=more_segment_before, unit_scale=False, generation_kwargs=generation_kwargs,
        )

    @core.recorded
    def infer_generator(self, spk_audio_prompt, text, output_path, emo_audio_prompt=None, emo_alpha=1.0,
                        emo_vector=None, use_emo_text=False, emo_text=None, use_random=False, interval_silence=200,
                        verbose=False, max_text_tokens_per_segment=120, stream_return=False, quick_streaming_tokens=0,
                        **generation_kwargs):
        return core.infer_generator(
            self, spk_audio_prompt=spk_audio_prompt, text=text, output_path=output_path,
            emo_audio_prompt=emo_audio_prompt, emo_alpha=emo_alpha, emo_vector=emo_vector, use_emo_text=use_emo_text,
            emo_text=emo_text, interval_silence=interval_silence,
            max_text_tokens_per_segment=max_text_tokens_per_segment, stream_return=stream_return,
            first_tokens=quick_streaming_tokens, unit_scale=False, generation_kwargs=generation_kwargs,
        )

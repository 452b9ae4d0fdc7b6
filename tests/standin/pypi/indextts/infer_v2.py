"""Stand-in for ``indextts/infer_v2.py`` of the PyPI repackaging ``indextts2-inference`` 2.1.1.

Other signature than upstream (model_dir first, ``language``/``attn_backend``, no ``use_qwen_emo``:
the Qwen emotion model is always loaded; ``quick_streaming_tokens`` instead of
``more_segment_before``), auxiliary models from the default Hugging Face cache, chunks in [-1, 1].
"""

try:
    import torch  # noqa: F401
except ImportError:
    pass

from ._standin import core

print(">> stand-in indextts.infer_v2 (indextts2-inference) imported")


class IndexTTS2:
    FLAVOUR = "pypi"

    @core.recorded
    def __init__(self, model_dir=None, cfg_path=None, use_fp16=False, device=None, use_cuda_kernel=None,
                 use_deepspeed=False, use_accel=False, use_torch_compile=False, language=None, attn_backend=None):
        core.construct(self, cfg_path=cfg_path, model_dir=model_dir, use_qwen_emo=True, use_accel=use_accel,
                       version="2")

    @core.recorded
    def infer(self, spk_audio_prompt, text, output_path, emo_audio_prompt=None, emo_alpha=1.0, emo_vector=None,
              use_emo_text=False, emo_text=None, use_random=False, interval_silence=200, verbose=False,
              max_text_tokens_per_segment=120, stream_return=False, quick_streaming_tokens=0, **generation_kwargs):
        return core.infer(
            self, spk_audio_prompt=spk_audio_prompt, text=text, output_path=output_path,
            emo_audio_prompt=emo_audio_prompt, emo_alpha=emo_alpha, emo_vector=emo_vector, use_emo_text=use_emo_text,
            emo_text=emo_text, interval_silence=interval_silence,
            max_text_tokens_per_segment=max_text_tokens_per_segment, stream_return=stream_return,
            first_tokens=quick_streaming_tokens, unit_scale=True, generation_kwargs=generation_kwargs,
        )

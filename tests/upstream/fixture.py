"""Tiny, randomly initialised IndexTTS checkpoint directories, built from upstream's own classes.

Runs inside an upstream venv (see build_venv.py), never in the project's own::

    UPSTREAM_PYTHON tests/upstream/fixture.py KIND OUT [--src UPSTREAM_CHECKOUT]

``KIND`` is one of:

``2``      IndexTTS-2 for the GitHub checkout (``indextts.infer_v2``), about 34 MB
``2.5``    IndexTTS-2.5 for the GitHub checkout (``indextts.infer_v2_5``), about 29 MB
``pypi2``  IndexTTS-2 for PyPI's ``indextts2-inference`` 2.1.1, about 200 MB
``pypi2.5`` IndexTTS-2.5 for PyPI's ``indextts25-inference`` 0.2.0, about 430 MB
``2-full``  IndexTTS-2 at its published size (``bench/bench_gpu.py``), about 500 MB
``2.5-full`` IndexTTS-2.5 at its published size, about 500 MB

The models speak noise, not words, and nothing is downloaded.  ``OUT`` also gets three
reference clips (``voice.wav``, ``voice2.wav``, ``voice3.wav``: 3 s, 22050 Hz, 16-bit).

What upstream needs, found by running it (a reason accompanies each choice below):

* The GitHub flavours load ``gpt.pth``, ``s2mel.pth`` (and 2.5's ``codec.pth``) non-strictly:
  empty state dicts leave the random initialisation in place.  The PyPI packages load strictly,
  so they get full state dicts (stored as fp16 to halve the size).
* IndexTTS-2 feeds GPT latents into s2mel: ``gpt.model_dim`` stays 1280, and every hidden size
  that meets w2v-bert stays 1024.  w2v-bert needs 17 layers at least (``hidden_states[17]``).
  The DiT and wavenet widths must be equal.
* transformers leaves w2v-bert's ``distance_embedding`` tables uninitialised (NaN output) unless
  the checkpoint holds them, so the fixture always ships them.
* The GitHub flavours and ``indextts25`` read auxiliary models from ``<model_dir>/hf_cache``;
  ``indextts2-inference`` reads them from the default Hugging Face cache, so ``pypi2`` writes them
  in hub layout under ``OUT/hf_home`` (run with ``HF_HOME=OUT/hf_home``), and adds a one-layer
  random Qwen emotion model, which that package always loads.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import math
import os
import sys
import time
import wave
from typing import Any

SAMPLE_RATE = 22050

_CONFORMER = {
    "output_size": 128,
    "linear_units": 128,
    "attention_heads": 2,
    "num_blocks": 1,
    "input_layer": "conv2d2",
    "perceiver_mult": 2,
}

#: IndexTTS-2's config.yaml, shrunk.
CONFIG_2: dict[str, Any] = {
    "dataset": {
        "bpe_model": "bpe.model",
        "sample_rate": 24000,
        "squeeze": False,
        "mel": {
            "sample_rate": 24000,
            "n_fft": 1024,
            "hop_length": 256,
            "win_length": 1024,
            "n_mels": 100,
            "mel_fmin": 0,
            "normalize": False,
        },
    },
    "gpt": {
        "model_dim": 1280,  # s2mel's gpt_layer expects 1280
        "max_mel_tokens": 1815,
        "max_text_tokens": 600,
        "heads": 4,
        "use_mel_codes_as_input": True,
        "mel_length_compression": 1024,
        "layers": 1,
        "number_text_tokens": 256,
        "number_mel_codes": 8194,
        "start_mel_token": 8192,
        "stop_mel_token": 8193,
        "start_text_token": 0,
        "stop_text_token": 1,
        "train_solo_embeddings": False,
        "condition_type": "conformer_perceiver",
        "condition_module": dict(_CONFORMER),
        "emo_condition_module": dict(_CONFORMER),
    },
    "semantic_codec": {
        "codebook_size": 8192,
        "hidden_size": 1024,  # the w2v-bert width
        "codebook_dim": 8,
        "vocos_dim": 64,
        "vocos_intermediate_dim": 128,
        "vocos_num_layers": 1,
    },
    "s2mel": {
        "preprocess_params": {
            "sr": SAMPLE_RATE,
            "spect_params": {
                "n_fft": 1024,
                "win_length": 1024,
                "hop_length": 256,
                "n_mels": 80,
                "fmin": 0,
                "fmax": "None",
            },
        },
        "dit_type": "DiT",
        "reg_loss_type": "l1",
        "style_encoder": {"dim": 192},
        "length_regulator": {
            "channels": 128,
            "is_discrete": False,
            "in_channels": 1024,
            "content_codebook_size": 2048,
            "sampling_ratios": [1, 1, 1, 1],
            "vector_quantize": False,
            "n_codebooks": 1,
            "quantizer_dropout": 0.0,
            "f0_condition": False,
            "n_f0_bins": 512,
        },
        "DiT": {
            "hidden_dim": 128,  # equal to wavenet.hidden_dim
            "num_heads": 4,
            "depth": 2,
            "class_dropout_prob": 0.1,
            "block_size": 8192,
            "in_channels": 80,
            "style_condition": True,
            "final_layer_type": "wavenet",
            "target": "mel",
            "content_dim": 128,
            "content_codebook_size": 1024,
            "content_type": "discrete",
            "f0_condition": False,
            "n_f0_bins": 512,
            "content_codebooks": 1,
            "is_causal": False,
            "long_skip_connection": True,
            "zero_prompt_speech_token": False,
            "time_as_token": False,
            "style_as_token": False,
            "uvit_skip_connection": True,
            "add_resblock_in_transformer": False,
        },
        "wavenet": {
            "hidden_dim": 128,
            "num_layers": 1,
            "kernel_size": 5,
            "dilation_rate": 1,
            "p_dropout": 0.2,
            "style_condition": True,
        },
    },
    "gpt_checkpoint": "gpt.pth",
    "w2v_stat": "wav2vec2bert_stats.pt",
    "s2mel_checkpoint": "s2mel.pth",
    "emo_matrix": "feat2.pt",
    "spk_matrix": "feat1.pt",
    "emo_num": [3, 17, 2, 8, 4, 5, 10, 24],
    "qwen_emo_path": "qwen0.6bemo4-merge/",
    "vocoder": {"type": "bigvgan", "name": "nvidia/bigvgan_v2_22khz_80band_256x"},
    "version": 2.0,
}


def config_25(*, small_gpt: bool) -> dict[str, Any]:
    """IndexTTS-2.5's config: no bpe model, a tokenizer-sized text vocabulary, version 2.5."""
    config = copy.deepcopy(CONFIG_2)
    del config["dataset"]
    # The tiktoken vocabulary (256 byte ranks, a few merges) plus 1673 special tokens must fit.
    config["gpt"]["number_text_tokens"] = 2048
    if small_gpt:
        # 2.5 conditions s2mel on CAMPPlus, not on GPT latents: the GPT width is free.
        config["gpt"].update(model_dim=512, heads=8)
        config["semantic_codec"].update(num_quantizers=1, downsample_scale=2)
    config["version"] = 2.5
    return config


#: IndexTTS-2 at its published size: the numbers of ``config.yaml`` in the IndexTeam/IndexTTS-2
#: checkpoint on Hugging Face (the file ``checkpoints_2/config.yaml`` of upstream's README); the
#: keys not set here are equal in both.  The GitHub flavours load ``gpt.pth`` and ``s2mel.pth``
#: non-strictly, so the weights stay random and the files empty: same compute, no download.
CONFIG_2_FULL: dict[str, Any] = copy.deepcopy(CONFIG_2)
CONFIG_2_FULL["gpt"].update(
    heads=20,
    layers=24,
    number_text_tokens=12000,
    condition_module={**_CONFORMER, "output_size": 512, "linear_units": 2048, "attention_heads": 8, "num_blocks": 6},
    emo_condition_module={
        **_CONFORMER,
        "output_size": 512,
        "linear_units": 1024,
        "attention_heads": 4,
        "num_blocks": 4,
    },
)
CONFIG_2_FULL["semantic_codec"].update(vocos_dim=384, vocos_intermediate_dim=2048, vocos_num_layers=12)
CONFIG_2_FULL["s2mel"]["length_regulator"]["channels"] = 512
CONFIG_2_FULL["s2mel"]["DiT"].update(hidden_dim=512, num_heads=8, depth=13, content_dim=512)
CONFIG_2_FULL["s2mel"]["wavenet"].update(hidden_dim=512, num_layers=8)


def config_25_full() -> dict[str, Any]:
    """IndexTTS-2.5 at its published size: upstream's ``configs/config_v2_5.yaml`` (GitHub, commit aa01d63).

    Its GPT, conditioning, codec and s2mel numbers are IndexTTS-2's; the text vocabulary is
    60509 tokens; the codec takes ``EnhancedCodec``'s defaults (one quantizer, downsampling 2).
    """
    config = copy.deepcopy(CONFIG_2_FULL)
    del config["dataset"]
    config["gpt"]["number_text_tokens"] = 60509
    config["semantic_codec"].update(num_quantizers=1, downsample_scale=2)
    config["version"] = 2.5
    return config


# ------------------------------------------------------------------ pieces


def _save_config(out: str, config: dict[str, Any]) -> Any:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(config)
    OmegaConf.save(cfg, os.path.join(out, "config.yaml"))
    return cfg


def _half(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.half() if v.is_floating_point() else v) for k, v in state.items()}


def _bpe_model(out: str) -> None:
    """A 120-piece sentencepiece BPE model trained on the spot (IndexTTS-2's text tokenizer)."""
    import numpy as np
    import sentencepiece as spm

    words = [
        "HELLO",
        "WORLD",
        "THIS",
        "IS",
        "A",
        "TEST",
        "OF",
        "THE",
        "SPEECH",
        "SYSTEM",
        "WE",
        "SPEAK",
        "SLOWLY",
        "AND",
        "CLEARLY",
        "ONE",
        "TWO",
        "THREE",
    ]
    rng = np.random.default_rng(0)
    corpus = os.path.join(out, "_corpus.txt")
    with open(corpus, "w") as f:
        for _ in range(2000):
            f.write(" ".join(rng.choice(words, 8)) + str(rng.choice([".", ",", "!", "?"])) + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=os.path.join(out, "bpe"),
        vocab_size=120,
        model_type="bpe",
        character_coverage=1.0,
        bos_id=0,
        eos_id=1,
        unk_id=2,
        pad_id=-1,
        user_defined_symbols=[",", ".", "!", "?"],
        minloglevel=2,
    )
    os.remove(corpus)
    os.remove(os.path.join(out, "bpe.vocab"))


def _tiktoken(out: str, merges: tuple[str, ...] = ()) -> None:
    """2.5's tokenizer file: every single byte (tiktoken needs them all), then ``merges``."""
    ranks = [bytes([b]) for b in range(256)] + [m.encode() for m in merges]
    with open(os.path.join(out, "multilingual_zh_ja_yue_char_del.tiktoken"), "w") as f:
        for rank, token in enumerate(ranks):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")


def _statistics(out: str, cfg: Any) -> None:
    import torch

    torch.save({"mean": torch.zeros(1024), "var": torch.ones(1024)}, os.path.join(out, "wav2vec2bert_stats.pt"))
    rows = sum(cfg.emo_num)
    torch.save(torch.randn(rows, 192), os.path.join(out, "feat1.pt"))
    torch.save(torch.randn(rows, cfg.gpt.model_dim) * 0.02, os.path.join(out, "feat2.pt"))


def _w2v_bert(folder: str, *, full: bool, published: bool = False) -> None:
    """w2v-bert-2.0 with 17 narrow layers; ``full`` ships every tensor (strict loaders).

    ``published``: its real size instead, transformers' ``Wav2Vec2BertConfig`` defaults, which
    are facebook/w2v-bert-2.0's (24 layers of 1024, 16 heads, 4096 wide).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig

    os.makedirs(folder, exist_ok=True)
    SeamlessM4TFeatureExtractor(padding_value=1.0).save_pretrained(folder)
    if published:
        config = Wav2Vec2BertConfig()
    else:
        config = Wav2Vec2BertConfig(num_hidden_layers=17, intermediate_size=64, num_attention_heads=16)
    config.save_pretrained(folder)
    tensors: dict[str, Any]
    if full:
        from transformers import Wav2Vec2BertModel

        tensors = {}
        for name, value in Wav2Vec2BertModel(config).state_dict().items():
            value = value.detach().clone()
            if value.is_floating_point() and (
                name.endswith("distance_embedding.weight") or not torch.isfinite(value).all()
            ):
                value = torch.randn_like(value) * 0.02
            tensors[name] = value.half() if value.is_floating_point() else value
    else:
        # One tensor is enough for from_pretrained (the rest starts random), except the
        # relative-position tables, which transformers would leave uninitialised.
        relative = config.left_max_position_embeddings + config.right_max_position_embeddings + 1
        width = config.hidden_size // config.num_attention_heads
        tensors = {
            f"encoder.layers.{i}.self_attn.distance_embedding.weight": torch.randn(relative, width) * 0.02
            for i in range(config.num_hidden_layers)
        }
        tensors["feature_projection.layer_norm.weight"] = torch.ones(160)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def _campplus(path: str, package: str) -> None:
    import importlib

    import torch

    dtdnn = importlib.import_module(f"{package}.s2mel.modules.campplus.DTDNN")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(dtdnn.CAMPPlus(feat_dim=80, embedding_size=192).state_dict(), path)


def _bigvgan(folder: str, package: str, *, published: bool = False) -> None:
    """A narrow BigVGAN (22 kHz, 80 bands, 256x) from the package's own config.

    ``published``: that config unchanged (nvidia/bigvgan_v2_22khz_80band_256x, 1536 channels).
    """
    import importlib

    import torch

    bigvgan = importlib.import_module(f"{package}.s2mel.modules.bigvgan.bigvgan")
    env = importlib.import_module(f"{package}.s2mel.modules.bigvgan.env")
    config_path = os.path.join(os.path.dirname(bigvgan.__file__), "config.json")
    if not os.path.isfile(config_path):
        # indextts25 ships none; indextts (installed beside it) and the GitHub checkout have the same one.
        other = importlib.import_module("indextts.s2mel.modules.bigvgan.bigvgan")
        config_path = os.path.join(os.path.dirname(other.__file__), "config.json")
    with open(config_path) as f:
        hparams = json.load(f)
    if not published:
        hparams["upsample_initial_channel"] = 64
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hparams, f)
    kwargs = {"use_cuda_kernel": False} if "use_cuda_kernel" in bigvgan.BigVGAN.__init__.__code__.co_varnames else {}
    generator = bigvgan.BigVGAN(env.AttrDict(hparams), **kwargs)
    torch.save({"generator": generator.state_dict()}, os.path.join(folder, "bigvgan_generator.pt"))


def _hub_snapshot(hub: str, repo_id: str) -> str:
    """A folder laid out as huggingface_hub's cache holds ``repo_id`` at revision main."""
    revision = "0" * 40
    base = os.path.join(hub, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(revision)
    snapshot = os.path.join(base, "snapshots", revision)
    os.makedirs(snapshot, exist_ok=True)
    return snapshot


def _qwen_emotion_model(folder: str) -> None:
    """A one-layer random Qwen3 whose greedy output is end-of-text at once (emotion: calm)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    specials = ["<|im_end|>", "<|im_start|>", "<unk>"]  # end of text is id 0
    words = sorted(set(["system", "user", "assistant", "文本情感分类", "happy", "calm"]))
    vocab = {token: i for i, token in enumerate(specials + words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", unk_token="<unk>", pad_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    tokenizer.save_pretrained(folder)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # equal logits: greedy picks id 0, end of text
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)


def write_voices(out: str) -> None:
    """Three 3 s reference clips with different pitch, 22050 Hz 16-bit mono."""
    import numpy as np

    rng = np.random.default_rng(0)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    for name, pitch in (("voice.wav", 180.0), ("voice2.wav", 120.0), ("voice3.wav", 240.0)):
        wobble = 1 + 0.3 * np.sin(2 * math.pi * 3 * t)
        pcm = 0.3 * np.sin(2 * math.pi * pitch * t) * wobble + 0.02 * rng.standard_normal(t.size)
        with wave.open(os.path.join(out, name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SAMPLE_RATE)
            w.writeframes((pcm * 32767).astype("<i2").tobytes())


def _upstream_src() -> str:
    src = os.environ.get("INDEXTTS_UPSTREAM_SRC")
    if not src:
        raise SystemExit("set INDEXTTS_UPSTREAM_SRC (or --src) to the upstream checkout")
    return src


# ------------------------------------------------------------------ flavours


def build_2(out: str, *, published: bool = False) -> None:
    import torch
    from indextts.codec.maskgct_codec import build_semantic_codec
    from safetensors.torch import save_model

    cfg = _save_config(out, CONFIG_2_FULL if published else CONFIG_2)
    _bpe_model(out)
    torch.save({}, os.path.join(out, "gpt.pth"))
    torch.save({"net": {}}, os.path.join(out, "s2mel.pth"))
    _statistics(out, cfg)
    cache = os.path.join(out, "hf_cache")
    _w2v_bert(os.path.join(cache, "w2v-bert-2.0"), full=False, published=published)
    save_model(build_semantic_codec(cfg.semantic_codec), os.path.join(cache, "semantic_codec_model.safetensors"))
    _campplus(os.path.join(cache, "campplus_cn_common.bin"), "indextts")
    _bigvgan(os.path.join(cache, "bigvgan"), "indextts", published=published)


def build_25(out: str, *, published: bool = False) -> None:
    import torch
    from indextts.utils.tokenizer import get_encoding

    cfg = _save_config(out, config_25_full() if published else config_25(small_gpt=True))
    _tiktoken(out, ("th", "he", "in", "er", "an", "re", "on", "st", " t", " a", " s", " th"))
    vocabulary = get_encoding(name="multilingual_zh_ja_yue_char_del", model_dir=out).n_vocab
    if vocabulary > cfg.gpt.number_text_tokens:
        raise SystemExit(f"tokenizer has {vocabulary} tokens, more than gpt.number_text_tokens")
    torch.save({}, os.path.join(out, "gpt.pth"))
    torch.save({"model": {}}, os.path.join(out, "codec.pth"))  # EnhancedCodec needs the 'model' key
    torch.save({"net": {}}, os.path.join(out, "s2mel.pth"))
    _statistics(out, cfg)
    cache = os.path.join(out, "hf_cache")
    _w2v_bert(os.path.join(cache, "w2v-bert-2.0"), full=False, published=published)
    _campplus(os.path.join(cache, "campplus_cn_common.bin"), "indextts")
    _bigvgan(os.path.join(cache, "bigvgan"), "indextts", published=published)


def build_pypi2(out: str) -> None:
    import torch
    from indextts.gpt.model_v2 import UnifiedVoice
    from indextts.utils.maskgct_utils import build_semantic_codec
    from safetensors.torch import save_model

    cfg = _save_config(out, CONFIG_2)
    _bpe_model(out)
    torch.save(_half(UnifiedVoice(**cfg.gpt).state_dict()), os.path.join(out, "gpt.pth"))
    torch.save({"net": {}}, os.path.join(out, "s2mel.pth"))
    _statistics(out, cfg)
    hub = os.path.join(out, "hf_home", "hub")
    _w2v_bert(_hub_snapshot(hub, "facebook/w2v-bert-2.0"), full=False)
    codec = os.path.join(_hub_snapshot(hub, "amphion/MaskGCT"), "semantic_codec")
    os.makedirs(codec, exist_ok=True)
    save_model(build_semantic_codec(cfg.semantic_codec), os.path.join(codec, "model.safetensors"))
    _campplus(os.path.join(_hub_snapshot(hub, "funasr/campplus"), "campplus_cn_common.bin"), "indextts")
    _bigvgan(_hub_snapshot(hub, cfg.vocoder.name), "indextts")
    _qwen_emotion_model(os.path.join(out, cfg.qwen_emo_path))


def build_pypi25(out: str) -> None:
    import torch
    from indextts25.codec.models import EnhancedCodec
    from indextts25.gpt.model_v2 import UnifiedVoice
    from indextts25.s2mel.modules.commons import MyModel

    cfg = _save_config(out, config_25(small_gpt=False))
    _tiktoken(out)
    torch.save(_half(UnifiedVoice(**cfg.gpt).state_dict()), os.path.join(out, "gpt.pth"))
    torch.save({"model": EnhancedCodec(**cfg.semantic_codec).state_dict()}, os.path.join(out, "codec.pth"))
    s2mel = MyModel(cfg.s2mel)
    torch.save({"net": {name: m.state_dict() for name, m in s2mel.models.items()}}, os.path.join(out, "s2mel.pth"))
    del s2mel
    _statistics(out, cfg)
    cache = os.path.join(out, "hf_cache")
    _w2v_bert(os.path.join(cache, "w2v-bert-2.0"), full=True)
    _campplus(os.path.join(cache, "campplus_cn_common.bin"), "indextts25")
    _bigvgan(os.path.join(cache, "bigvgan"), "indextts25")


BUILDERS = {
    "2": build_2,
    "2.5": build_25,
    "pypi2": build_pypi2,
    "pypi2.5": build_pypi25,
    "2-full": lambda out: build_2(out, published=True),
    "2.5-full": lambda out: build_25(out, published=True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a tiny random IndexTTS checkpoint directory.")
    parser.add_argument("kind", choices=sorted(BUILDERS))
    parser.add_argument("out")
    parser.add_argument("--src", help="the upstream checkout (GitHub kinds); default $INDEXTTS_UPSTREAM_SRC")
    args = parser.parse_args(argv)
    if args.src:
        os.environ["INDEXTTS_UPSTREAM_SRC"] = args.src
    if not args.kind.startswith("pypi"):
        sys.path.insert(0, _upstream_src())
    started = time.monotonic()
    import torch

    torch.manual_seed(0)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    BUILDERS[args.kind](out)
    write_voices(out)
    print(f"built {args.kind} in {out} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

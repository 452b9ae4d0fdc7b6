"""Shared implementation of the stand-in ``indextts`` flavours.  See README.md.

Each flavour directory (v2, v25, pypi) holds an ``indextts`` package whose classes copy
upstream's signatures exactly and forward to this module, which reproduces upstream's
behaviour as read from upstream's source (commit ee40fa7) and verified by running it:

* ``infer(stream_return=True)`` returns an unstarted generator: nothing runs, and nothing
  fails, before the first ``next()`` (reference processing happens lazily).
* The stream yields each segment followed by a silence, the last segment too.  With
  ``interval_silence=0`` the "silence" is upstream's list of the segments so far.
* ``infer(stream_return=False)`` is ``list(infer_generator(...))[0]``: the (22050, int16 of
  shape (N, 1)) tuple with silence between segments only, or the path when writing a file.
* Empty or whitespace-only text raises RuntimeError (``torch.cat`` of no segments), in both
  modes; ``infer`` never returns None for it.
* ``do_sample`` and the other documented sampling keys are popped; any other generation
  keyword reaches Hugging Face ``generate``, which raises ValueError at the first segment
  (not with ``use_accel`` on CUDA, whose engine ignores them).
* ``use_emo_text`` without the Qwen model raises RuntimeError (at the first ``next()``).
* One reference slot per role, keyed by the prompt path string: ``cache_spk_cond``,
  ``cache_s2mel_style``, ``cache_s2mel_prompt``, ``cache_mel``, ``cache_spk_audio_prompt``,
  ``cache_emo_cond``, ``cache_emo_audio_prompt``, reused while the path is unchanged (even
  when the file has changed, as upstream does).

Nothing here imports torch: chunks are :class:`FakeTensor` objects (numpy inside) with the
``.cpu().numpy()`` surface the adapter uses.  Behaviour is steered by environment
variables, read on every call so one process can be steered between requests:

INDEXTTS_STANDIN_LOG               JSON lines: every constructor, infer and infer_generator call
                                   (args and kwargs as passed), every reference processed
                                   (``reference``), every segment produced (with the digests of
                                   the references it used), generator close and end
INDEXTTS_STANDIN_CONSTRUCT_SECONDS the constructor sleeps this long (slow construction)
INDEXTTS_STANDIN_CONSTRUCT_GATE    the constructor blocks until this file exists
INDEXTTS_STANDIN_FAIL_CONSTRUCTS   the first N constructions raise RuntimeError, counted in
INDEXTTS_STANDIN_COUNTER           this file (required with the previous one)
INDEXTTS_STANDIN_GATE_DIR          segment k >= 2 waits for <dir>/segment-<k> or <dir>/open;
                                   <dir>/produced-<k> is written as segment k is produced
INDEXTTS_STANDIN_AUDIO             raw int16 LE file: its samples are the speech, split over
                                   the segments (instead of the default tones)
INDEXTTS_STANDIN_NO_STREAM         "1": ignore stream_return and return the (sr, int16) tuple,
                                   like an upstream from before streaming
INDEXTTS_STANDIN_INFER_ERROR       the first next() raises RuntimeError with this message
INDEXTTS_STANDIN_CUDA              "1": CUDA is "available" (as in ../torchstub), so use_accel
                                   gives the GPT an accel engine
"""

import hashlib
import json
import math
import os
import sys
import time
import types
import wave

import numpy as np

SAMPLE_RATE = 22050
_GATE_TIMEOUT = 60.0
#: Sampling keys upstream pops from ``generation_kwargs`` (``do_sample`` is popped and ignored).
GENERATION_KEYS = (
    "do_sample", "top_p", "top_k", "temperature", "length_penalty", "num_beams", "repetition_penalty",
    "max_mel_tokens",
)
#: Auxiliary models read from ``<model_dir>/hf_cache`` (downloaded there when absent).
AUX_2 = ("w2v-bert-2.0/", "semantic_codec_model.safetensors", "campplus_cn_common.bin", "bigvgan/")
AUX_25 = ("w2v-bert-2.0/", "campplus_cn_common.bin", "bigvgan/")
#: What each model version's constructor reads from the checkpoint directory (besides config).
VERSION_FILES = {"2": ("gpt.pth", "bpe.model"), "2.5": ("gpt.pth", "codec.pth")}


def _env(name, default=None):
    return os.environ.get("INDEXTTS_STANDIN_" + name, default)


def record(event, **data):
    path = _env("LOG")
    if not path:
        return
    entry = {"event": event, "pid": os.getpid(), **data}
    line = json.dumps(entry, default=repr) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def _wait_for(paths, what):
    deadline = time.monotonic() + _GATE_TIMEOUT
    while not any(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise RuntimeError(f"stand-in: gave up waiting for {what}")
        time.sleep(0.002)


class FakeTensor:
    """The slice of torch.Tensor the adapter touches."""

    def __init__(self, array):
        self._array = array

    @property
    def shape(self):
        return self._array.shape

    @property
    def dtype(self):
        return self._array.dtype

    def detach(self):
        return self

    def cpu(self):
        return self

    def float(self):
        return FakeTensor(self._array.astype(np.float32))

    def numpy(self):
        return self._array


#: The stage times the stand-in prints after each inference, as upstream does.
STAGE_TIMES = {"gpt_gen": 0.25, "gpt_forward": 0.05, "s2mel": 0.12, "bigvgan": 0.03}


def _stdout_noise(label, lines=10):
    """Upstream prints about ten lines per request, from Python and from C."""
    for i in range(lines):
        if i % 2:
            os.write(1, f">> stand-in {label}: raw fd 1 line {i}\n".encode())
        else:
            print(f">> stand-in {label}: print() line {i}")
    sys.stdout.flush()


def recorded(fn):
    """Record every call as passed (positional args and kwargs), keeping the real signature."""
    import functools

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        record(fn.__name__, flavour=self.FLAVOUR, module=type(self).__module__, args=list(args), kwargs=kwargs)
        return fn(self, *args, **kwargs)

    return wrapper


def _cuda_on():
    return _env("CUDA") == "1"


def _offline_env():
    """What the caller set around construction (the adapter: HF_HUB_OFFLINE=1 unless downloads are allowed)."""
    return {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def _auxiliary(model_dir, names, aux_paths):
    """Upstream reads the auxiliary models from ``aux_paths`` or ``<model_dir>/hf_cache``, and
    downloads the missing ones there: tests have no network, so a download is an error here."""
    if aux_paths is not None:
        for key, path in aux_paths.items():
            if not os.path.exists(path):
                raise OSError(f"stand-in: aux_paths[{key!r}] {path} does not exist (local_files_only=True)")
        return
    cache = os.path.join(model_dir, "hf_cache")
    missing = [name for name in names if not os.path.exists(os.path.join(cache, name.rstrip("/")))]
    if missing:
        record("download", names=missing, env=_offline_env())
        raise RuntimeError(f"stand-in: upstream would download {', '.join(missing)} into {cache} (no network here)")


def construct(model, *, cfg_path, model_dir, use_qwen_emo, use_accel, version, aux=None, aux_paths=None):
    """What the stand-in constructors share: noise, delays, failures, the files upstream reads.

    ``aux``: the auxiliary models read from ``<model_dir>/hf_cache`` (None: the default
    Hugging Face cache, as the PyPI repackaging does, never checked).
    """
    print(">> stand-in: loading GPT weights")
    os.write(1, b">> stand-in: loading semantic codec\n")
    seconds = float(_env("CONSTRUCT_SECONDS", "0") or 0)
    if seconds:
        time.sleep(seconds)
    gate = _env("CONSTRUCT_GATE")
    if gate:
        _wait_for([gate], "the construct gate")
    failures = int(_env("FAIL_CONSTRUCTS", "0") or 0)
    if failures:
        counter = _env("COUNTER")
        count = 0
        if os.path.exists(counter):
            with open(counter) as f:
                count = int(f.read().strip() or 0)
        count += 1
        with open(counter, "w") as f:
            f.write(str(count))
        if count <= failures:
            raise RuntimeError(f"stand-in: injected construct failure {count} of {failures}")
    if model_dir is None:
        raise RuntimeError("stand-in: model_dir=None would download the model from a hub (no network here)")
    if cfg_path is not None and not os.path.isfile(cfg_path):
        raise FileNotFoundError(cfg_path)
    if use_qwen_emo and not os.path.isdir(os.path.join(model_dir, "qwen0.6bemo4-merge")):
        raise FileNotFoundError(os.path.join(model_dir, "qwen0.6bemo4-merge"))
    for name in VERSION_FILES[version]:
        if not os.path.isfile(os.path.join(model_dir, name)):
            raise FileNotFoundError(os.path.join(model_dir, name))
    if aux is not None:
        _auxiliary(model_dir, aux, aux_paths)
    model.cfg_path = cfg_path
    model.model_dir = model_dir
    model.qwen_emo = "stand-in QwenEmotion" if use_qwen_emo else None
    model.use_accel = use_accel
    model.gpt = types.SimpleNamespace(accel_engine="stand-in accel engine" if use_accel and _cuda_on() else None)
    model.cache_spk_cond = None
    model.cache_s2mel_style = None
    model.cache_s2mel_prompt = None
    model.cache_spk_audio_prompt = None
    model.cache_emo_cond = None
    model.cache_emo_audio_prompt = None
    model.cache_mel = None
    model.gr_progress = None
    if version != "2.5":
        model.tokenizer = Tokenizer()
    record("constructed", flavour=model.FLAVOUR, env=_offline_env())


def _cut(items, max_tokens, first_tokens):
    """Segments of ``max_tokens`` items each (the first of ``first_tokens``, when set)."""
    items = list(items)
    segments = []
    limit = first_tokens if first_tokens else max_tokens
    while items:
        take = max(1, min(limit, max_tokens))
        segments.append(items[:take])
        items = items[take:]
        limit = max_tokens
    return segments


class Tokenizer:
    """Upstream 2.0's ``TextTokenizer`` as far as the adapter sees it: ``tokenize`` normalises
    (here: upper-cases, as 2.0's tokenizer does English) into sentencepiece pieces, one per
    word, and ``split_segments`` cuts the pieces into segments."""

    def tokenize(self, text):
        return ["\u2581" + word.upper() for word in text.split()]

    def split_segments(self, tokenized, max_text_tokens_per_segment=120, quick_streaming_tokens=0):
        return _cut(tokenized, max_text_tokens_per_segment, quick_streaming_tokens)


def split_text_by_tokens(text, max_tokens, lang_prefix=""):
    """Upstream 2.5's ``split_text_by_tokens``: the (normalised) text of each segment."""
    return [" ".join(words) for words in _cut(text.split(), max_tokens, 0)]


def _segments(model, text, max_tokens, first_tokens):
    """The words of each segment, from the segmenter upstream calls where upstream calls it:
    2.5 ``self.split_text_by_tokens`` on the text, 2.0 ``self.tokenizer.split_segments`` on
    its pieces."""
    if model.FLAVOUR == "2.5":
        return [segment.split() for segment in model.split_text_by_tokens(text, max_tokens, "<|en|> ")]
    pieces = model.tokenizer.tokenize(text)
    segments = model.tokenizer.split_segments(pieces, max_tokens, quick_streaming_tokens=first_tokens)
    return [[piece.lstrip("\u2581") for piece in segment] for segment in segments]


def _tone(index, words):
    n = 2205 * len(words)
    t = np.arange(n, dtype=np.float64)
    tone = np.sin(t * (2 * math.pi * (200 + 40 * index) / SAMPLE_RATE) + 0.5) * 12000
    return np.rint(tone).astype(np.int16)


def _speech(segments):
    """int16 audio per segment."""
    path = _env("AUDIO")
    if not path or not segments:
        return [_tone(i, words) for i, words in enumerate(segments)]
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype="<i2").astype(np.int16)
    return [piece for piece in np.array_split(data, len(segments))]


def _digest(path):
    with open(path, "rb") as f:  # upstream: librosa.load, which fails on a missing file
        return hashlib.sha256(f.read()).hexdigest()[:16]


def _speaker(model, path):
    """Upstream's speaker slot: recomputed only when the path string differs."""
    if model.cache_spk_cond is None or model.cache_spk_audio_prompt != path:
        model.cache_spk_cond = model.cache_s2mel_style = model.cache_s2mel_prompt = model.cache_mel = None
        digest = _digest(path)
        record("reference", role="speaker", path=path, digest=digest)
        model.cache_spk_cond = f"spk_cond:{digest}"
        model.cache_s2mel_style = f"style:{digest}"
        model.cache_s2mel_prompt = f"prompt:{digest}"
        model.cache_mel = f"mel:{digest}"
        model.cache_spk_audio_prompt = path
    return model.cache_spk_cond.partition(":")[2]


def _emotion(model, path):
    """Upstream's emotion slot: recomputed only when the path string differs."""
    if model.cache_emo_cond is None or model.cache_emo_audio_prompt != path:
        model.cache_emo_cond = None
        digest = _digest(path)
        record("reference", role="emotion", path=path, digest=digest)
        model.cache_emo_cond = f"emo_cond:{digest}"
        model.cache_emo_audio_prompt = path
    return model.cache_emo_cond.partition(":")[2]


def infer(model, *, stream_return, **kwargs):
    """Upstream's ``infer``: the generator itself when streaming, else its first (only) item."""
    if _env("NO_STREAM") == "1":
        stream_return = False
    generator = infer_generator(model, stream_return=stream_return, **kwargs)
    if stream_return:
        return generator
    try:
        return list(generator)[0]
    except IndexError:
        return None


def infer_generator(model, *, spk_audio_prompt, text, output_path, emo_audio_prompt, emo_alpha, emo_vector,
                    use_emo_text, emo_text, interval_silence, max_text_tokens_per_segment, stream_return,
                    first_tokens, unit_scale, generation_kwargs):
    """Upstream's ``infer_generator``, in upstream's order; see the module docstring."""
    _stdout_noise("infer", 10)
    error = _env("INFER_ERROR")
    if error:
        raise RuntimeError(error)
    if use_emo_text or emo_vector is not None:
        emo_audio_prompt = None
    if use_emo_text:
        if model.qwen_emo is None:
            raise RuntimeError(
                "use_emo_text=True requires QwenEmotion, but it was not loaded at init "
                "(use_qwen_emo=False). Re-construct IndexTTS2 with use_qwen_emo=True."
            )
        emo_vector = [0.0] * 7 + [1.0]  # the stand-in's QwenEmotion always hears "calm"
    if emo_audio_prompt is None:
        emo_audio_prompt = spk_audio_prompt
    speaker = _speaker(model, spk_audio_prompt)
    if emo_vector is not None and len(emo_vector) != 8:
        raise RuntimeError(
            f"The size of tensor a ({len(emo_vector)}) must match the size of tensor b (8) at non-singleton dimension 0"
        )
    emotion = _emotion(model, emo_audio_prompt)
    segments = _segments(model, text, max_text_tokens_per_segment, first_tokens)
    generation = dict(generation_kwargs)
    for key in GENERATION_KEYS:
        generation.pop(key, None)
    gate_dir = _env("GATE_DIR")
    wavs = []
    silence = None
    produced = 0
    try:
        speech = _speech(segments)
        for k, audio in enumerate(speech, start=1):
            if gate_dir and k >= 2:
                _wait_for([os.path.join(gate_dir, f"segment-{k}"), os.path.join(gate_dir, "open")], f"segment {k}")
            if generation and model.gpt.accel_engine is None:
                raise ValueError(
                    f"The following `model_kwargs` are not used by the model: {sorted(generation)} "
                    "(note: typos in the generate arguments will also show up in this list)"
                )
            if gate_dir:
                with open(os.path.join(gate_dir, f"produced-{k}"), "w"):
                    pass
            record("segment", index=k, of=len(speech), samples=int(audio.size), speaker=speaker, emotion=emotion)
            produced = k
            wav = _chunk(audio, unit_scale)
            wavs.append(wav)
            if stream_return:
                yield wav
                if silence is None:
                    # upstream's interval_silence(): the list of wavs itself when interval_silence <= 0
                    silence = wavs if interval_silence <= 0 else _chunk(_zeros(interval_silence), unit_scale)
                yield silence
    except GeneratorExit:
        record("closed", produced=produced)
        raise
    record("finished", produced=produced)
    if not wavs:
        raise RuntimeError("torch.cat(): expected a non-empty list of Tensors")
    _stdout_noise("timings", 4)
    for stage, seconds in STAGE_TIMES.items():  # upstream prints its stage times here, through print()
        print(f">> {stage}_time: {seconds:.2f} seconds")
    if stream_return:
        return
    parts = []
    for i, audio in enumerate(speech):
        if i and interval_silence > 0:
            parts.append(_zeros(interval_silence))
        parts.append(audio)
    wav = np.concatenate(parts).reshape(-1, 1)
    if output_path:
        with wave.open(output_path, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SAMPLE_RATE)
            w.writeframes(wav.astype("<i2").tobytes())
        yield output_path
        return
    yield (SAMPLE_RATE, wav)


def _zeros(interval_silence):
    return np.zeros(int(SAMPLE_RATE * interval_silence / 1000.0), dtype=np.int16)


def _chunk(int16, unit_scale):
    """A streamed chunk: float32 (1, n) on PCM scale, or in [-1, 1] for the PyPI repackaging."""
    if unit_scale:
        return FakeTensor((int16.astype(np.float32) / np.float32(32768.0)).reshape(1, -1))
    return FakeTensor(int16.astype(np.float32).reshape(1, -1))

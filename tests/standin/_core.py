"""Shared implementation of the stand-in ``indextts`` flavours.  See README.md.

Each flavour directory (v2, v25, pypi) holds an ``indextts`` package whose classes copy
upstream's signatures exactly and forward to :class:`StandIn`.  Nothing here imports
torch: chunks are :class:`FakeTensor` objects (numpy inside) with the ``.cpu().numpy()``
surface the adapter uses.  Behaviour is steered by environment variables, read on every
call so one process can be steered between requests through files:

INDEXTTS_STANDIN_LOG               JSON lines: every constructor and infer call (args and
                                   kwargs as passed), every segment produced, generator close
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
INDEXTTS_STANDIN_INFER_ERROR       infer raises RuntimeError with this message
"""

import json
import math
import os
import sys
import time
import wave

import numpy as np

SAMPLE_RATE = 22050
_GATE_TIMEOUT = 60.0


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


def construct(model, cfg_path, model_dir, use_qwen_emo):
    """What the stand-in constructors share: noise, delays, failures, file checks."""
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
    if cfg_path is not None and not os.path.isfile(cfg_path):
        raise FileNotFoundError(cfg_path)
    if model_dir is not None and not os.path.isfile(os.path.join(model_dir, "gpt.pth")):
        raise FileNotFoundError(os.path.join(model_dir, "gpt.pth"))
    if use_qwen_emo and model_dir is not None and not os.path.isdir(os.path.join(model_dir, "qwen0.6bemo4-merge")):
        raise FileNotFoundError(os.path.join(model_dir, "qwen0.6bemo4-merge"))
    model.cfg_path = cfg_path
    model.model_dir = model_dir
    model.use_qwen_emo = use_qwen_emo
    record("constructed", flavour=model.FLAVOUR)


def _segments(text, max_tokens, first_tokens):
    words = text.split()
    segments = []
    limit = first_tokens if first_tokens else max_tokens
    while words:
        take = max(1, min(limit, max_tokens))
        segments.append(words[:take])
        words = words[take:]
        limit = max_tokens
    return segments


def _tone(index, words):
    n = 2205 * len(words)
    t = np.arange(n, dtype=np.float64)
    tone = np.sin(t * (2 * math.pi * (200 + 40 * index) / SAMPLE_RATE) + 0.5) * 12000
    return np.rint(tone).astype(np.int16)


def _speech(segments):
    """int16 audio per segment."""
    path = _env("AUDIO")
    if not path:
        return [_tone(i, words) for i, words in enumerate(segments)]
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype="<i2").astype(np.int16)
    return [piece for piece in np.array_split(data, len(segments))]


def infer(model, *, spk_audio_prompt, text, output_path, emo_audio_prompt, emo_alpha, emo_vector, use_emo_text,
          emo_text, interval_silence, max_text_tokens_per_segment, stream_return, first_tokens, unit_scale):
    """Upstream's infer: returns a generator when streaming, else the tuple (or path, or None)."""
    _stdout_noise("infer", 10)
    error = _env("INFER_ERROR")
    if error:
        raise RuntimeError(error)
    with open(spk_audio_prompt, "rb"):
        pass
    if use_emo_text:
        if not model.use_qwen_emo:
            raise RuntimeError("use_emo_text requires use_qwen_emo=True")
    elif emo_vector is None and emo_audio_prompt is not None:
        with open(emo_audio_prompt, "rb"):
            pass
    if emo_vector is not None and len(emo_vector) != 8:
        raise ValueError("emo_vector must have 8 values")
    segments = _segments(text, max_text_tokens_per_segment, first_tokens)
    if stream_return and _env("NO_STREAM") != "1":
        return _generate(segments, interval_silence, unit_scale)
    if not segments:
        return None
    parts = []
    silence = np.zeros(int(SAMPLE_RATE * interval_silence / 1000), dtype=np.int16)
    for i, audio in enumerate(_speech(segments)):
        if i:
            parts.append(silence)
        parts.append(audio)
    wav = np.concatenate(parts).reshape(-1, 1)
    if output_path:
        with wave.open(output_path, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SAMPLE_RATE)
            w.writeframes(wav.astype("<i2").tobytes())
        return output_path
    return (SAMPLE_RATE, wav)


def _chunk(int16, unit_scale):
    if unit_scale:
        return FakeTensor((int16.astype(np.float32) / np.float32(32768.0)).astype(np.float32))
    return FakeTensor(int16.astype(np.float32).reshape(1, -1))


def _generate(segments, interval_silence, unit_scale):
    gate_dir = _env("GATE_DIR")
    produced = 0
    try:
        speech = _speech(segments)
        silence = np.zeros(int(SAMPLE_RATE * interval_silence / 1000), dtype=np.int16)
        for k, audio in enumerate(speech, start=1):
            if gate_dir and k >= 2:
                _wait_for([os.path.join(gate_dir, f"segment-{k}"), os.path.join(gate_dir, "open")], f"segment {k}")
            if gate_dir:
                with open(os.path.join(gate_dir, f"produced-{k}"), "w"):
                    pass
            record("segment", index=k, of=len(speech), samples=int(audio.size))
            produced = k
            yield _chunk(audio, unit_scale)
            yield _chunk(silence, unit_scale)
    except GeneratorExit:
        record("closed", produced=produced)
        raise
    record("finished", produced=produced)

"""The sidecar with natural stops, for bench_gpu's ``stream`` cell on random-weight checkpoints.

Random weights never choose the GPT's stop token, so every segment of a request runs to the
request's ``max_mel_tokens``: a stream's short first segment (a few words) generates as many
codes as a whole sentence, and a text cut into one more segment speaks that much more.  A real
model stops near its segment text's natural length.  This launcher gives the random model that
stop, and nothing else: it is the command of the cell's sidecar (``Client(command=[python,
"bench/_natural_stop.py"])``, in upstream's venv, this repository on ``PYTHONPATH``), and

1. wraps the IndexTTS engine's ``load`` (the class attribute, in this process only) so that,
   once a model is loaded, the outermost ``gpt.inference_speech`` of that model instance is a
   wrapper (the engine's own wrappers stay inside it, upstream's code is untouched);
2. the wrapper reads the segment's text back from the call's ``text_inputs`` (upstream's
   ``infer_v2.py`` and ``infer_v2_5.py`` pass one segment's ids): IndexTTS-2's sentencepiece
   model, or 2.5's ``tokenizer.decode``, turns them into text, without the ``stop_text_token``
   2.5 pads each segment with and without special tokens such as 2.5's ``<|EN|>`` (IndexTTS-2's
   text comes back upper-cased and normalised, as long as the segment's words).  It then lowers
   ``max_generate_length`` to that text's natural length at the run's scale, bench_gpu's own
   budget: ``len(text) / CHARS_PER_SECOND * scale * TOKENS_PER_SECOND[model]`` rounded, at
   least 1, never above what the request asked.  The bench passes the rate per character in
   ``INDEXTTS_BENCH_TOKENS_PER_CHAR``;
3. prints one line a call on stderr, ``natural-stop: N text tokens, C chars, cap CAP of ASKED``,
   which the bench reads back (through the client's sidecar log) to report each segment's cap;
4. runs ``indextts_sidecar`` as ``__main__``, with this command line.

A batched call (rows of several requests) is capped at its longest row's natural length.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import runpy
import sys
from collections.abc import Callable
from typing import Any

#: Upstream's special tokens as a tokenizer decodes them (2.5's language prefix, ``<|EN|>``).
_SPECIAL = re.compile(r"<\|[^|]*\|>")
_SPACES = re.compile(r"\s+")
#: The rate per character of text, set by bench_gpu.py.
ENV = "INDEXTTS_BENCH_TOKENS_PER_CHAR"
#: The line printed for each call, as bench_gpu.py reads it back: the cap is group 1.
LINE_RE = re.compile(r"natural-stop: \d+ text tokens, \d+ chars, cap (\d+) of ")


def segment_text(model: Any, ids: list[int]) -> tuple[int, int]:
    """One segment's text tokens and characters, read back from its text ids."""
    stop = getattr(model.gpt, "stop_text_token", None)
    while ids and ids[-1] == stop:  # 2.5 pads each segment with it (infer_v2_5.py)
        ids = ids[:-1]
    tokenizer = model.tokenizer
    sentencepiece = getattr(tokenizer, "sp_model", None)
    # IndexTTS-2's TextTokenizer.decode re-spaces CJK characters after sentencepiece, and mangles
    # text around unknown pieces: its sentencepiece model decodes the ids as they are.
    text = str(sentencepiece.Decode(ids) if sentencepiece is not None else tokenizer.decode(ids))
    return len(ids), len(_SPACES.sub(" ", _SPECIAL.sub("", text)).strip())


def install(model: Any, tokens_per_char: float) -> None:
    """Wrap ``model.gpt.inference_speech`` (the instance's, outermost) with the natural stop."""
    gpt = model.gpt
    original: Callable[..., Any] = gpt.inference_speech
    signature = inspect.signature(original)

    @functools.wraps(original)  # the engine's batching hooks bind the call by this signature
    def inference_speech(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        text_inputs = bound.arguments["text_inputs"]
        rows = text_inputs.tolist()
        rows = rows if rows and isinstance(rows[0], list) else [rows]
        tokens, chars = max((segment_text(model, [int(i) for i in row]) for row in rows), key=lambda tc: tc[1])
        asked = bound.arguments.get("max_generate_length")
        if asked is None:
            asked = int(getattr(gpt, "max_mel_tokens", 0)) or None
        cap = max(1, round(chars * tokens_per_char))
        if asked is not None:
            cap = min(cap, int(asked))
        bound.arguments["max_generate_length"] = cap
        print(f"natural-stop: {tokens} text tokens, {chars} chars, cap {cap} of {asked}", file=sys.stderr, flush=True)
        return original(*bound.args, **bound.kwargs)

    gpt.inference_speech = inference_speech


def patch_load(tokens_per_char: float) -> None:
    """After the engine loads a model, put the natural stop on it (once per model instance)."""
    from indextts_sidecar.engines.indextts._adapter import IndexTTSEngine

    load = IndexTTSEngine.load

    @functools.wraps(load)
    def natural_load(self: Any, *args: Any, **kwargs: Any) -> None:
        load(self, *args, **kwargs)
        model = self._model
        if model is not None and not getattr(model, "_bench_natural_stop", False):
            install(model, tokens_per_char)
            model._bench_natural_stop = True

    IndexTTSEngine.load = natural_load  # type: ignore[method-assign]


def main() -> None:
    value = os.environ.get(ENV)
    if value is None:
        raise SystemExit(f"{ENV} is not set (bench/bench_gpu.py sets it)")
    tokens_per_char = float(value)
    if not tokens_per_char > 0:
        raise SystemExit(f"{ENV} must be a positive number, not {value!r}")
    patch_load(tokens_per_char)
    runpy.run_module("indextts_sidecar", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

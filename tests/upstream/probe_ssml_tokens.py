"""Run in an upstream venv: what upstream's own text path makes of texts the SSML renderer wrote.

``probe_ssml_tokens.py FLAVOUR MODEL_DIR VOICE LANG TEXT [LANG TEXT...]`` builds upstream's ``IndexTTS2`` (the
tiny fixture), runs its ``infer`` on each text up to the tokenizer, and prints one JSON line per
text: IndexTTS-2.5's segments as upstream cut them, each one's token ids (``tokenizer.encode``
as upstream calls it, stopped there) and the ids of ``<|SPECIAL_TOKEN_1|>``/``<|SPECIAL_TOKEN_2|>``;
IndexTTS-2's BPE pieces of the normalised text (``tokenizer.tokenize``, stopped there).  Nothing of
the model runs past the text: the encoder raises once it has the ids.
"""

from __future__ import annotations

import json
import sys


class _Stop(Exception):
    pass


def main() -> None:
    flavour, model_dir, voice, *pairs = sys.argv[1:]  # LANG TEXT LANG TEXT ...
    if flavour == "2.5":
        from indextts.infer_v2_5 import IndexTTS2
    else:
        from indextts.infer_v2 import IndexTTS2
    extra = {} if flavour == "2.5" else {"use_qwen_emo": False}  # no emotion model: not the text path
    tts = IndexTTS2(cfg_path=f"{model_dir}/config.yaml", model_dir=model_dir, device="cpu", **extra)
    tokenizer = tts.tokenizer
    encode = tokenizer.encode
    split = getattr(tts, "split_text_by_tokens", None)
    segments: list[str] = []
    seen: list[list[int]] = []

    def split_spy(*args: object, **kwargs: object) -> list[str]:
        assert split is not None
        segments[:] = split(*args, **kwargs)
        seen.clear()  # what the splitter encoded to measure is not what the model gets
        return segments

    def encode_spy(text: str, *args: object, **kwargs: object) -> list[int]:
        ids = list(encode(text, *args, **kwargs))
        if segments:
            seen.append(ids)
            if len(seen) == len(segments):  # every segment's ids, as the GPT would get them
                raise _Stop
        return ids

    tokenize = getattr(tokenizer, "tokenize", None)

    def tokenize_spy(text: str) -> list[str]:  # IndexTTS-2: the BPE pieces its GPT gets, by name
        assert tokenize is not None
        pieces = list(tokenize(text))
        segments[:] = [text]
        seen.append(pieces)  # type: ignore[arg-type]
        raise _Stop

    if flavour == "2.5":
        tts.split_text_by_tokens = split_spy  # type: ignore[method-assign]
        tokenizer.encode = encode_spy  # type: ignore[method-assign]
    else:
        tokenizer.tokenize = tokenize_spy  # type: ignore[method-assign]
    special = {}
    if flavour == "2.5":
        for name in ("<|SPECIAL_TOKEN_1|>", "<|SPECIAL_TOKEN_2|>"):
            special[name] = list(encode(name, allowed_special="all"))
    for lang, text in zip(pairs[::2], pairs[1::2], strict=True):
        seen.clear()
        segments.clear()
        language = {"lang": lang} if flavour == "2.5" else {}
        try:
            tts.infer(spk_audio_prompt=voice, text=text, output_path=None, verbose=False, **language)
        except _Stop:
            pass
        print(json.dumps({"text": text, "segments": segments, "ids": seen, "special": special}), flush=True)


if __name__ == "__main__":
    main()

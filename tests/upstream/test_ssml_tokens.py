"""The SSML renderings for IndexTTS, at the token level, on upstream's own code and the tiny
fixtures: what the client sends for a ``<phoneme>`` reaches the tokenizer as upstream's special
tokens (IndexTTS-2.5's pronunciation marks) or as the upper-case pinyin written (IndexTTS-2).

The client renders the SSML here (``indextts_client._ssml``); ``probe_ssml_tokens.py`` runs in
upstream's venv, builds its ``IndexTTS2`` from the fixture and stops its ``infer`` at the
tokenizer, printing what it got.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import HERE, ROOT, flavour_named

from indextts_client._ssml import parse_ssml
from indextts_client._ssml._render import Segment, render

pytest.importorskip("defusedxml")


def _rendered(ssml: str, engine: str) -> str:
    (segment,) = render(parse_ssml(ssml), engine, None)
    assert isinstance(segment, Segment)
    return segment.text


def _probe(name: str, checkpoints: Any, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    flavour = flavour_named(name)
    ckpt: Path = checkpoints(flavour)
    args = [a for pair in pairs for a in pair]
    done = subprocess.run(
        [flavour.python, str(HERE / "probe_ssml_tokens.py"), name, str(ckpt), str(ckpt / "voice.wav"), *args],
        env={**os.environ, **flavour.env(HF_HOME=str(ckpt / "hf_cache"))},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_indextts25_pronunciation_marks_reach_the_tokenizer_as_special_tokens(checkpoints: Any) -> None:
    english = _rendered(
        '<speak>we are <phoneme alphabet="x-arpabet" ph="g ow1 . ih0 ng">going</phoneme> home</speak>', "indextts2.5"
    )
    chinese = _rendered('<speak>去银<phoneme alphabet="pinyin" ph="hang2">行</phoneme></speak>', "indextts2.5")
    kana = _rendered('<speak><phoneme alphabet="x-kana" ph="にほん">日本</phoneme></speak>', "indextts2.5")
    assert (english, chinese, kana) == ("we are <going|G OW1 . IH0 NG> home", "去银<行|HANG2>", "<日本|にほん>")
    got = _probe("2.5", checkpoints, [("en", english), ("zh", chinese), ("ja", kana), ("en", "we are going home")])
    first, second, third, plain = got
    one, two = first["special"]["<|SPECIAL_TOKEN_1|>"], first["special"]["<|SPECIAL_TOKEN_2|>"]
    assert len(one) == len(two) == 1  # each one token of upstream's vocabulary
    # English: ARPAbet between two SPECIAL_TOKEN_1, the word itself gone
    assert first["segments"] == ["we are <|SPECIAL_TOKEN_1|>G OW1 . IH0 NG<|SPECIAL_TOKEN_1|> home"]
    (ids,) = first["ids"]
    assert ids.count(one[0]) == 2 and two[0] not in ids
    between = ids[ids.index(one[0]) + 1 : len(ids) - 1 - ids[::-1].index(one[0])]
    assert between and one[0] not in between
    # Chinese: the pinyin between two SPECIAL_TOKEN_2
    assert second["segments"] == ["去银<|SPECIAL_TOKEN_2|>HANG2<|SPECIAL_TOKEN_2|>"]
    (ids,) = second["ids"]
    assert ids.count(two[0]) == 2 and one[0] not in ids
    # kana: inserted as kana, no special token
    (ids,) = third["ids"]
    assert one[0] not in ids and two[0] not in ids and "にほん" in third["segments"][0]
    # and plain text has none
    (ids,) = plain["ids"]
    assert one[0] not in ids and two[0] not in ids


def test_indextts2_reads_the_upper_case_pinyin_written(checkpoints: Any) -> None:
    text = _rendered('<speak>去银<phoneme alphabet="pinyin" ph="hang2">行</phoneme></speak>', "indextts2")
    assert text == "去银HANG2"
    (got,) = _probe("2", checkpoints, [("zh", text)])
    (pieces,) = got["ids"]
    # the normaliser kept the syllable and its tone digit (no 二, no lower case): the tiny BPE
    # model cuts it into pieces, which spell it
    assert "".join(pieces).replace("\u2581", "") == "去银HANG2"

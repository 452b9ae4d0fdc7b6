"""The espeak engine, called directly in-process: real speech from libespeak-ng."""

from __future__ import annotations

import array
import itertools
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from indextts_sidecar.engines import RequestError, SynthesisRequest, Words, WordSpan
from indextts_sidecar.engines.espeak import (
    EspeakEngine,
    EspeakOptions,
    EspeakRequestOptions,
    sentence_spans,
    sentence_words,
    split_sentences,
)

pytest.importorskip("espeakng_loader")


def _progress(*args: Any, **kwargs: Any) -> None:
    pass


def _never() -> bool:
    return False


def _request(text: str, voice: str | None = None, **options: Any) -> SynthesisRequest[EspeakRequestOptions]:
    return SynthesisRequest(
        id=1, text=text, voice=voice, emotion=None, options=msgspec.convert(options, EspeakRequestOptions)
    )


def _speak(engine: EspeakEngine, text: str, cancelled: Callable[[], bool] = _never, **kwargs: Any) -> list[bytes]:
    chunks = engine.synthesize(_request(text, **kwargs), _progress, cancelled)
    return [bytes(c) for c in chunks if not isinstance(c, Words)]


def _samples(chunks: list[bytes]) -> array.array[int]:
    samples = array.array("h", b"".join(chunks))
    if sys.byteorder == "big":
        samples.byteswap()
    return samples


# espeak-ng state is process-global, so every test shares one engine instance.
@pytest.fixture(scope="module")
def engine() -> Iterator[EspeakEngine]:
    eng = EspeakEngine(EspeakOptions())
    eng.load(_progress, _never)
    yield eng
    eng.unload()


def test_speech_has_energy_and_scales_with_text(engine: EspeakEngine) -> None:
    short = _samples(_speak(engine, "Hello there"))
    long = _samples(_speak(engine, "Hello there, " * 6))
    rms = math.sqrt(sum(s * s for s in long) / len(long))
    assert rms > 500, rms  # speech, not silence or dither
    # 0.2..5 s for two words at 175 wpm at 22050 Hz.
    assert 0.2 * 22050 < len(short) < 5 * 22050
    assert 3 < len(long) / len(short) < 9  # six times the words: roughly six times the audio


def test_rate_option_changes_duration(engine: EspeakEngine) -> None:
    fast = _samples(_speak(engine, "The quick brown fox jumps over the lazy dog", rate=400))
    slow = _samples(_speak(engine, "The quick brown fox jumps over the lazy dog", rate=100))
    assert len(slow) > 2 * len(fast)


def test_sentences_stream_as_separate_chunks(engine: EspeakEngine) -> None:
    fractions: list[float] = []
    request = _request("First sentence here. Second one follows!\nThird line")
    yielded = engine.synthesize(request, lambda stage, f=None, m="": fractions.append(f), _never)
    chunks = [c for c in yielded if not isinstance(c, Words)]
    assert len(chunks) == 3
    assert all(len(c) > 0 and len(c) % 2 == 0 for c in chunks)
    assert fractions == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_cancel_after_first_chunk_stops_early(engine: EspeakEngine) -> None:
    flag = [False]
    chunks = []
    spoken: list[WordSpan] = []
    for chunk in engine.synthesize(_request("One. Two. Three. Four."), _progress, lambda: flag[0]):
        if isinstance(chunk, Words):
            spoken += chunk.words
            continue
        chunks.append(chunk)
        flag[0] = True
    assert len(chunks) == 1
    assert [(w.start_char, w.end_char) for w in spoken] == [(0, 3)]  # "One": no word of a sentence not spoken
    # An aborted synth leaves the library usable.
    assert len(_speak(engine, "Still working. Yes.")) == 2


def test_cancel_before_start_yields_nothing(engine: EspeakEngine) -> None:
    assert _speak(engine, "Never spoken.", cancelled=lambda: True) == []


def test_voices(engine: EspeakEngine) -> None:
    for voice in ("en-us", "de", "fr"):
        assert _speak(engine, "Bonjour", voice=voice)
    with pytest.raises(RequestError) as info:
        _speak(engine, "Hello", voice="no-such-voice")
    assert info.value.field == "voice"
    assert "unknown" in str(info.value)


def test_check_rejects_empty_text(engine: EspeakEngine) -> None:
    with pytest.raises(RequestError) as info:
        engine.check(_request("  \n\t "))
    assert info.value.field == "text"
    engine.check(_request("fine"))


def test_option_validation() -> None:
    with pytest.raises(msgspec.ValidationError, match="rate"):
        msgspec.convert({"rate": 10}, EspeakRequestOptions)
    with pytest.raises(msgspec.ValidationError, match="pitch"):
        msgspec.convert({"pitch": 101}, EspeakRequestOptions)
    with pytest.raises(msgspec.ValidationError, match="speed"):
        msgspec.convert({"speed": 1}, EspeakRequestOptions)
    with pytest.raises(msgspec.ValidationError, match="rate"):
        msgspec.convert({"rate": 1000}, EspeakOptions)
    with pytest.raises(ValueError, match="pitch"):
        EspeakOptions(pitch=-1)


def test_load_unload_load(engine: EspeakEngine) -> None:
    engine.unload()
    assert not engine.loaded
    engine.unload()  # idempotent
    events: list[tuple[Any, ...]] = []
    engine.load(lambda *a: events.append(a), _never)
    assert engine.loaded
    assert engine.sample_rate == EspeakEngine.native_sample_rate == 22050
    assert events[0][:2] == ("load", 0.0)
    assert events[-1][:2] == ("load", 1.0)
    assert _speak(engine, "Back again.")


def test_split_sentences() -> None:
    assert split_sentences("Hi. Pi is 3.14; yes!\n\nWhat? ok") == ["Hi.", "Pi is 3.14;", "yes!", "What?", "ok"]


def test_import_is_light() -> None:
    code = (
        "import sys, indextts_sidecar.engines.espeak; "
        "heavy = {'espeakng_loader', 'ctypes'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# Names the library takes, in several spellings.
_TAKEN = [
    *("en", "EN", "en-us", "en-US", "pt-BR", "cmn", "yue", "de", "fr", "en-gb-x-rp"),  # languages
    *("English (America)", "english (america)", "German"),  # name lines
    *("gmw/en-US", "gmw/en", "gmw"),  # file paths
    *("en+f3", "en+F3", "en+nope", "en-us+klatt", "de+Alex", "Mr serious", "en+"),  # variants
]
# Names it refuses that no voice file mentions: check refuses them too.
_UNKNOWN = ["en_us", "en-zz", "zz", "xx-yy", "nonsense", "english", "+f3", "en-", "e", "lang/gmw/en-US", " en", "en\t"]


def _library_takes(engine: EspeakEngine, voice: str) -> bool:
    return bool(engine._lib.espeak_SetVoiceByName(voice.encode()) == 0)


def _check_takes(engine: EspeakEngine, voice: str) -> bool:
    try:
        engine.check(_request("x", voice=voice))
    except RequestError as exc:
        refusal = (exc.field, "unknown espeak-ng voice" in str(exc))
    else:
        return True
    assert refusal == ("voice", True)
    return False


def test_check_never_refuses_a_voice_the_library_takes(engine: EspeakEngine) -> None:
    voices = engine.voices()
    assert voices is not None and len(voices) > 100
    assert {"en-us", "de", "fr"} <= {language for voice in voices for language in voice["languages"]}
    spellings = [s for voice in voices for s in (voice["name"], voice["identifier"], *voice["languages"])]
    taken = [voice for voice in [*_TAKEN, *spellings] if _library_takes(engine, voice)]
    assert set(_TAKEN) <= set(taken)
    assert [voice for voice in taken if not _check_takes(engine, voice)] == []
    # A few secondary language codes ("en-gb", "zh") pass the check but not the library by
    # name: synthesis speaks them with the voice file that declares them (the next test).
    assert [voice for voice in _UNKNOWN if _library_takes(engine, voice)] == []
    assert [voice for voice in _UNKNOWN if _check_takes(engine, voice)] == []


def test_every_name_and_language_voices_lists_is_spoken(engine: EspeakEngine) -> None:
    voices = engine.voices()
    assert voices is not None
    spellings = sorted({s for voice in voices for s in (voice["name"], voice["identifier"], *voice["languages"])})
    assert {"en-gb", "zh", "fr-fr", "Cherokee"} <= set(spellings)  # taken by no espeak_SetVoiceByName
    assert not [name for name in spellings if "//" in name]  # a comment on a name line is no part of it
    refused = []
    for spelling in spellings:
        try:
            _speak(engine, "A.", voice=spelling)
        except RequestError:
            refused.append(spelling)
    assert refused == []
    assert len(_samples(_speak(engine, "Hello there.", voice="en-gb+f3"))) > 22050 // 2  # with a variant too


def test_an_unknown_voice_is_refused_by_check_before_any_synthesis() -> None:
    engine = EspeakEngine(EspeakOptions())  # never loaded: check needs no library
    with pytest.raises(RequestError, match="unknown espeak-ng voice 'no-such-voice'") as info:
        engine.check(_request("Hello", voice="no-such-voice"))
    assert info.value.field == "voice"
    engine.check(_request("Hello", voice="en-us+f3"))
    assert not engine.loaded


def test_probe_finds_the_wheel() -> None:
    assert EspeakEngine.probe() is None


def _timeline(engine: EspeakEngine, text: str, **options: Any) -> tuple[int, list[WordSpan]]:
    """Samples and words of ``text``; each word checked to come before the chunk holding its first sample."""
    samples = 0
    spoken: list[WordSpan] = []
    for value in engine.synthesize(_request(text, **options), _progress, _never):
        if isinstance(value, Words):
            assert all(word.start >= samples for word in value.words), (value, samples)
            spoken += value.words
        else:
            samples += len(value) // 2
            assert all(word.start < samples for word in spoken)
    return samples, spoken


@pytest.mark.parametrize(
    "text",
    [
        "Hello big world, again. The quick brown fox jumps over the lazy dog!\nA third line",
        "Grüße, Ωmega café. Naïve cats sleep; Zoë reads.",
        "  Spaces   before and\tbetween  words.  ",
    ],
)
def test_every_word_comes_with_its_span_and_samples_in_order(engine: EspeakEngine, text: str) -> None:
    samples, spoken = _timeline(engine, text)
    assert [text[w.start_char : w.end_char] for w in spoken] == re.findall(r"\w+", text)
    starts = [w.start for w in spoken]
    assert starts == sorted(set(starts)), "starts strictly increase"
    assert all(w.start < w.end <= samples for w in spoken)
    # Each word ends where the next starts, or at its clause's end (a comma, a sentence's end).
    for word, after in itertools.pairwise(spoken):
        assert word.end <= after.start
    assert spoken[-1].end == samples
    # The first word of each sentence starts at that sentence's first sample.
    sentence_starts = {start for start, _ in sentence_spans(text)}
    firsts = [w for w in spoken if w.start_char in sentence_starts]
    assert len(firsts) == len(sentence_spans(text)) and firsts[0].start == 0


def test_a_word_of_several_code_points_and_one_outside_the_bmp_map_back_to_the_text(engine: EspeakEngine) -> None:
    # A combining diaeresis (two code points), a character outside the BMP (four UTF-8 bytes)
    # and CJK (three bytes each): espeak counts characters, not bytes, as Python does.
    text = "I 😀 love nai\u0308ve 日本 cats."
    _, spoken = _timeline(engine, text)
    assert [text[w.start_char : w.end_char] for w in spoken] == ["I", "😀", "love", "nai\u0308ve", "日本", "cats"]


def test_numbers_spoken_as_several_words_are_one_word_and_quotes_are_trimmed(engine: EspeakEngine) -> None:
    text = "It costs 3.14 dollars at 10:30, “quoted” today."
    _, spoken = _timeline(engine, text)
    assert [text[w.start_char : w.end_char] for w in spoken] == [
        "It", "costs", "3.14", "dollars", "at", "10:30", "quoted", "today",
    ]  # fmt: skip


def test_sentence_words_cleans_up_what_espeak_reports() -> None:
    text = "Say it, “again” now 3.14."
    sentence = (4, len(text))  # "it, “again” now 3.14."
    events = [
        (1, 1, 2, 0),  # "it"
        (5, 4, 0, 900),  # the clause ends at the comma
        (1, 5, 0, 900),  # length 0: the word that starts there ("“again”" trimmed to "again")
        (1, 13, 5, 2000),  # "now 3" from a wrong length: trimmed, kept
        (1, 17, 4, 3000),  # "3.14" overlaps: merged into the word before
        (1, 18, 2, 1500),  # an earlier sample: merged too
        (1, 16, 1, 3500),  # a space alone: dropped
        (1, 99, 3, 9999),  # past the sentence and the audio: clamped, empty, dropped
    ]
    words = sentence_words(text, *sentence, events, samples=5000, offset=10_000)
    assert [text[w.start_char : w.end_char] for w in words] == ["it", "again", "now 3.14"]
    assert [(w.start, w.end) for w in words] == [(10_000, 10_900), (10_900, 12_000), (12_000, 15_000)]

"""The SSML reader (indextts_client/_ssml): every tag, every error, and the hostile battery.

Each case reads a document and checks the plan's content (texts, exact silences, rates,
annotations, source spans) or the error's code, tag, attribute and position.
"""

from __future__ import annotations

import time
import tracemalloc
from fractions import Fraction
from typing import Any, Union

import pytest

from indextts_client import InvalidRequestError
from indextts_client._ssml import Silence, SsmlError, SsmlLimits, SsmlPlan, TextRun, parse_ssml

pytest.importorskip("defusedxml")


def _speak(body: str, lang: str = "") -> str:
    attr = f' xml:lang="{lang}"' if lang else ""
    return f"<speak{attr}>{body}</speak>"


def _runs(plan: SsmlPlan) -> list[TextRun]:
    return [item for item in plan.items if isinstance(item, TextRun)]


def _shape(plan: SsmlPlan) -> list[Any]:
    """The plan as plain values: ("text", text, rate, lang, rewrite, phoneme) or ("break", seconds)."""
    out: list[Any] = []
    for item in plan.items:
        if isinstance(item, Silence):
            out.append(("break", item.seconds))
        else:
            ph = (item.phoneme.alphabet, item.phoneme.ph) if item.phoneme else None
            out.append(("text", item.text, item.rate, item.lang, item.rewrite, ph))
    return out


def _t(
    text: str,
    rate: Fraction = Fraction(1),
    lang: Union[str, None] = None,
    rewrite: Union[str, None] = None,
    ph: Any = None,
) -> Any:
    return ("text", text, rate, lang, rewrite, ph)


def _b(seconds: Union[str, int]) -> Any:
    return ("break", Fraction(seconds))


F = Fraction
READS = [
    ("plain", _speak("Hello world."), [_t("Hello world.")]),
    ("entities", _speak("a &amp; b &lt; c"), [_t("a & b < c")]),
    ("paragraph and sentences", _speak("<p><s>One.</s><s>Two.</s></p>Three"), [_t("One. Two. Three")]),
    ("break ms", _speak('a<break time="250ms"/>b'), [_t("a"), _b("1/4"), _t("b")]),
    ("break s", _speak('a<break time="1.5s"/>b'), [_t("a"), _b("3/2"), _t("b")]),
    ("break fraction of a ms", _speak('a<break time="0.5ms"/>b'), [_t("a"), _b("1/2000"), _t("b")]),
    ("break bare", _speak("a<break/>b"), [_t("a"), _b("1/2"), _t("b")]),
    (
        "break strength",
        _speak('a<break strength="x-strong"/>b<break strength="none"/>c'),
        [_t("a"), _b(1), _t("b"), _b(0), _t("c")],
    ),
    ("break time over strength", _speak('a<break strength="weak" time="2s"/>b'), [_t("a"), _b(2), _t("b")]),
    ("prosody percent", _speak('<prosody rate="150%">quick</prosody> slow'), [_t("quick", F(3, 2)), _t(" slow")]),
    ("prosody word", _speak('<prosody rate="x-slow">slow</prosody>'), [_t("slow", F(1, 2))]),
    ("prosody number", _speak('<prosody rate="1.25">x</prosody>'), [_t("x", F(5, 4))]),
    (
        "prosody relative nested",
        _speak('<prosody rate="200%">a<prosody rate="-25%">b</prosody></prosody>'),
        [_t("a", F(2)), _t("b", F(3, 2))],
    ),
    (
        "phoneme arpabet",
        _speak('<phoneme alphabet="x-arpabet" ph="G OW1 . IH0 NG">going</phoneme>'),
        [_t("going", ph=("x-arpabet", "G OW1 . IH0 NG"))],
    ),
    (
        "phoneme pinyin",
        _speak('银<phoneme alphabet="pinyin" ph="hang2">行</phoneme>'),
        [_t("银"), _t("行", ph=("pinyin", "hang2"))],
    ),
    (
        "phoneme kana",
        _speak('<phoneme alphabet="x-kana" ph="にほん">日本</phoneme>'),
        [_t("日本", ph=("x-kana", "にほん"))],
    ),
    ("sub", _speak('<sub alias="World Wide Web">WWW</sub>'), [_t("World Wide Web", rewrite="sub")]),
    ("say-as characters", _speak('<say-as interpret-as="characters">IBM</say-as>'), [_t("I B M", rewrite="say-as")]),
    ("say-as spell-out", _speak('<say-as interpret-as="spell-out">ab c</say-as>'), [_t("a b c", rewrite="say-as")]),
    (
        "say-as digits en",
        _speak('<say-as interpret-as="digits">2024</say-as>'),
        [_t("two zero two four", rewrite="say-as")],
    ),
    (
        "say-as cardinal en",
        _speak('<say-as interpret-as="cardinal">1,234</say-as>'),
        [_t("one thousand two hundred thirty-four", rewrite="say-as")],
    ),
    (
        "say-as ordinal en",
        _speak('<say-as interpret-as="ordinal">22</say-as>'),
        [_t("twenty-second", rewrite="say-as")],
    ),
    (
        "say-as digits zh",
        _speak('<say-as interpret-as="digits">2024</say-as>', "zh-CN"),
        [_t("二零二四", lang="zh-CN", rewrite="say-as")],
    ),
    (
        "say-as cardinal zh",
        _speak('<say-as interpret-as="cardinal">10010</say-as>', "zh"),
        [_t("一万零一十", lang="zh", rewrite="say-as")],
    ),
    (
        "say-as ordinal zh",
        _speak('<say-as interpret-as="ordinal">15</say-as>', "zh"),
        [_t("第十五", lang="zh", rewrite="say-as")],
    ),
    ("lang", _speak('Hi <lang xml:lang="zh-CN">你好</lang>', "en"), [_t("Hi ", lang="en"), _t("你好", lang="zh-CN")]),
    ("lang on s", _speak('<s xml:lang="de">Hallo</s>'), [_t("Hallo", lang="de")]),
    ("comment and cdata", _speak("a<!-- note -->b<![CDATA[<c>]]>"), [_t("ab<c>")]),
    ("namespace and version", '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis">x</speak>', [_t("x")]),
]


@pytest.mark.parametrize(("source", "expected"), [case[1:] for case in READS], ids=[case[0] for case in READS])
def test_reads(source: str, expected: list[Any]) -> None:
    assert _shape(parse_ssml(source)) == expected


def test_spans_point_into_the_source() -> None:
    source = (
        '<speak>Hello &amp; <s>welcome</s><break time="250ms"/> to é中 '
        '<sub alias="the web">WWW</sub> <phoneme alphabet="x-arpabet" ph="G OW1">going</phoneme></speak>'
    )
    plan = parse_ssml(source)
    runs = _runs(plan)
    hello = runs[0]
    assert hello.text == "Hello & welcome"
    start, end = hello.source_span(0, 7)  # "Hello &"
    assert source[start:end] == "Hello &amp;"
    start, end = hello.source_span(8, 15)
    assert source[start:end] == "welcome"
    silence = next(item for item in plan.items if isinstance(item, Silence))
    assert source[slice(*silence.span)] == '<break time="250ms"/>'
    assert (silence.line, silence.column) == (1, source.index("<break") + 1)
    to = runs[1]
    start, end = to.source_span(to.text.index("é中"), to.text.index("é中") + 2)
    assert source[start:end] == "é中"  # non-ASCII: byte offsets turned into characters
    sub = runs[2]
    assert source[slice(*sub.source_span(0, 3))] == '<sub alias="the web">WWW</sub>'
    going = runs[-1]
    assert source[slice(*going.span)] == '<phoneme alphabet="x-arpabet" ph="G OW1">going</phoneme>'
    assert source[slice(*going.source_span(0, 5))] == "going"


def test_silence_samples_are_exact() -> None:
    (_, silence, _) = parse_ssml(_speak('a<break time="333ms"/>b')).items
    assert isinstance(silence, Silence)
    assert silence.samples(24000) == 7992
    assert silence.samples(22050) == round(F(333, 1000) * 22050)  # 7342.65 -> 7343
    assert silence.samples(22050) == 7343


#: (name, source, code, tag, attribute, line, column)
ERRORS = [
    ("not speak", "<p>x</p>", "invalid_ssml", "p", None, 1, 1),
    ("speak in speak", "<speak><speak>x</speak></speak>", "invalid_ssml", "speak", None, 1, 8),
    ("malformed", "<speak>x</spek>", "invalid_ssml", None, None, 1, 11),
    ("unknown tag", "<speak>\n  <audio src='a.wav'/></speak>", "unsupported", "audio", None, 2, 3),
    ("unknown attribute", '<speak><prosody pitch="+2st">x</prosody></speak>', "unsupported", "prosody", "pitch", 1, 8),
    (
        "say-as format",
        '<speak><say-as interpret-as="cardinal" format="x">1</say-as></speak>',
        "unsupported",
        "say-as",
        "format",
        1,
        8,
    ),
    (
        "say-as date",
        '<speak><say-as interpret-as="date">1/2</say-as></speak>',
        "unsupported",
        "say-as",
        "interpret-as",
        1,
        8,
    ),
    (
        "say-as language",
        '<speak xml:lang="fr"><say-as interpret-as="cardinal">2</say-as></speak>',
        "unsupported",
        "say-as",
        "xml:lang",
        1,
        22,
    ),
    ("say-as no interpret-as", "<speak><say-as>1</say-as></speak>", "invalid_ssml", "say-as", "interpret-as", 1, 8),
    (
        "cardinal not a number",
        '<speak><say-as interpret-as="cardinal">x1</say-as></speak>',
        "invalid_ssml",
        "say-as",
        "interpret-as",
        1,
        8,
    ),
    (
        "cardinal too long",
        '<speak><say-as interpret-as="cardinal">1234567890123456</say-as></speak>',
        "invalid_ssml",
        "say-as",
        "interpret-as",
        1,
        8,
    ),
    (
        "ordinal zero",
        '<speak><say-as interpret-as="ordinal">0</say-as></speak>',
        "invalid_ssml",
        "say-as",
        "interpret-as",
        1,
        8,
    ),
    (
        "phoneme ipa",
        '<speak><phoneme alphabet="ipa" ph="x">a</phoneme></speak>',
        "unsupported",
        "phoneme",
        "alphabet",
        1,
        8,
    ),
    ("phoneme no ph", '<speak><phoneme alphabet="pinyin">a</phoneme></speak>', "invalid_ssml", "phoneme", "ph", 1, 8),
    (
        "phoneme bad pinyin",
        '<speak><phoneme alphabet="pinyin" ph="hang9">a</phoneme></speak>',
        "invalid_ssml",
        "phoneme",
        "ph",
        1,
        8,
    ),
    (
        "phoneme bad arpabet",
        '<speak><phoneme alphabet="x-arpabet" ph="G|OW">a</phoneme></speak>',
        "invalid_ssml",
        "phoneme",
        "ph",
        1,
        8,
    ),
    (
        "phoneme bad kana",
        '<speak><phoneme alphabet="x-kana" ph="abc">a</phoneme></speak>',
        "invalid_ssml",
        "phoneme",
        "ph",
        1,
        8,
    ),
    (
        "phoneme empty",
        '<speak><phoneme alphabet="pinyin" ph="a1"> </phoneme></speak>',
        "invalid_ssml",
        "phoneme",
        None,
        1,
        8,
    ),
    (
        "element in phoneme",
        '<speak><phoneme alphabet="pinyin" ph="a1"><s>a</s></phoneme></speak>',
        "invalid_ssml",
        "s",
        None,
        1,
        43,
    ),
    ("sub no alias", "<speak><sub>a</sub></speak>", "invalid_ssml", "sub", "alias", 1, 8),
    ("lang no xml:lang", "<speak><lang>a</lang></speak>", "invalid_ssml", "lang", "xml:lang", 1, 8),
    ("bad xml:lang", '<speak xml:lang="e n">a</speak>', "invalid_ssml", "speak", "xml:lang", 1, 1),
    ("break negative", '<speak><break time="-1s"/></speak>', "invalid_ssml", "break", "time", 1, 8),
    ("break no unit", '<speak><break time="100"/></speak>', "invalid_ssml", "break", "time", 1, 8),
    ("break hours", '<speak><break time="1h"/></speak>', "invalid_ssml", "break", "time", 1, 8),
    ("break nan", '<speak><break time="nans"/></speak>', "invalid_ssml", "break", "time", 1, 8),
    ("break exponent", '<speak><break time="1e9s"/></speak>', "invalid_ssml", "break", "time", 1, 8),
    ("break a year", '<speak><break time="31536000s"/></speak>', "invalid_ssml", "break", "time", 1, 8),
    (
        "breaks add up",
        "<speak>" + '<break time="20s"/>' * 3 + '<break time="1ms"/></speak>',
        "invalid_ssml",
        "break",
        "time",
        1,
        65,
    ),
    ("break strength unknown", '<speak><break strength="loud"/></speak>', "invalid_ssml", "break", "strength", 1, 8),
    ("rate unknown", '<speak><prosody rate="quick">a</prosody></speak>', "invalid_ssml", "prosody", "rate", 1, 8),
    ("rate too fast", '<speak><prosody rate="500%">a</prosody></speak>', "invalid_ssml", "prosody", "rate", 1, 8),
    ("rate zero", '<speak><prosody rate="0%">a</prosody></speak>', "invalid_ssml", "prosody", "rate", 1, 8),
    ("rate relative number", '<speak><prosody rate="+1">a</prosody></speak>', "invalid_ssml", "prosody", "rate", 1, 8),
    ("attribute with markup", '<speak><break time="<b>1s</b>"/></speak>', "invalid_ssml", None, None, 1, 21),
    (
        "escaped markup in ph",
        '<speak><phoneme alphabet="pinyin" ph="&lt;b&gt;">x</phoneme></speak>',
        "invalid_ssml",
        "phoneme",
        "ph",
        1,
        8,
    ),
    ("undefined entity", "<speak>&nbsp;</speak>", "invalid_ssml", None, None, 1, 8),
    ("processing instruction", "<speak><?php system('x') ?>a</speak>", "invalid_ssml", "?php", None, 1, 8),
    ("dtd", "<!DOCTYPE speak [<!ELEMENT speak ANY>]><speak>a</speak>", "invalid_ssml", "!DOCTYPE", None, 1, None),
    (
        "billion laughs",
        '<!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "' + "&a;" * 10 + '"><!ENTITY c "' + "&b;" * 10 + '">]>'
        "<speak>&c;</speak>",
        "invalid_ssml",
        "!DOCTYPE",
        None,
        1,
        None,
    ),
    (
        "external entity",
        '<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
        "invalid_ssml",
        "!DOCTYPE",
        None,
        1,
        None,
    ),
    (
        "external dtd",
        '<!DOCTYPE speak SYSTEM "http://example.com/speak.dtd"><speak>a</speak>',
        "invalid_ssml",
        "!DOCTYPE",
        None,
        1,
        None,
    ),
    ("text outside", "<speak>a</speak>b", "invalid_ssml", None, None, 1, 17),
    ("empty", "", "invalid_ssml", None, None, 1, 1),
]


@pytest.mark.parametrize(
    ("source", "code", "tag", "attribute", "line", "column"),
    [case[1:] for case in ERRORS],
    ids=[case[0] for case in ERRORS],
)
def test_errors(
    source: str, code: str, tag: Union[str, None], attribute: Union[str, None], line: int, column: Union[int, None]
) -> None:
    with pytest.raises(SsmlError) as caught:
        parse_ssml(source)
    error = caught.value
    assert isinstance(error, InvalidRequestError)  # a 400-class refusal wherever a server maps errors
    assert (error.code, error.tag, error.attribute, error.line) == (code, tag, attribute, line)
    if column is not None:
        assert error.column == column
    assert error.detail["field"] == "text" and error.detail["line"] == line
    assert f"line {line}" in str(error)


def test_not_strict_reads_unsupported_tags_as_their_text() -> None:
    source = _speak(
        '<audio src="x.wav">ding</audio> <prosody pitch="+2st">up</prosody> '
        '<phoneme alphabet="ipa" ph="x">word</phoneme>'
    )
    with pytest.raises(SsmlError):
        parse_ssml(source)
    plan = parse_ssml(source, strict=False)
    assert plan.text == "ding up word"
    assert all(run.phoneme is None for run in _runs(plan))


def test_a_bare_ampersand_is_malformed() -> None:
    with pytest.raises(SsmlError, match="not well-formed"):
        parse_ssml("<speak>a & b</speak>")


def test_limits_are_parameters() -> None:
    limits = SsmlLimits(max_silence=2.0, max_elements=3, max_depth=2, max_bytes=100)
    with pytest.raises(SsmlError, match="more than 2 s"):
        parse_ssml(_speak('<break time="1500ms"/><break time="501ms"/>'), limits=limits)
    assert parse_ssml(_speak('<break time="2s"/>'), limits=limits).silence == 2
    with pytest.raises(SsmlError, match="more than 3 elements"):
        parse_ssml(_speak("<s>a</s><s>b</s><s>c</s>"), limits=limits)
    with pytest.raises(SsmlError, match="nested more than 2"):
        parse_ssml(_speak("<p><s>a</s></p>"), limits=limits)
    with pytest.raises(SsmlError, match="over the limit of 100"):
        parse_ssml(_speak("a" * 100), limits=limits)


#: Hostile documents: each is refused, typed, in bounded time and memory.
HOSTILE = {
    "deep nesting": "<speak>" + "<s>" * 10_000 + "x" + "</s>" * 10_000 + "</speak>",
    "100,000 tags": "<speak>" + "<s/>" * 100_000 + "</speak>",
    "billion laughs": (
        '<!DOCTYPE l [<!ENTITY a "'
        + "a" * 100
        + '">'
        + "".join(f'<!ENTITY {chr(98 + i)} "' + f"&{chr(97 + i)};" * 10 + '">' for i in range(9))
        + "]><speak>&j;</speak>"
    ),
    "quadratic blowup": '<!DOCTYPE l [<!ENTITY a "' + "a" * 50_000 + '">]><speak>' + "&a;" * 10_000 + "</speak>",
    "a year of breaks": "<speak>" + '<break time="59s"/>' * 2 + "</speak>",
    "a huge attribute": '<speak><break time="' + "9" * 500_000 + 's"/></speak>',
    "a megabyte and more": "<speak>" + "a" * (1 << 20) + "</speak>",
}


@pytest.mark.parametrize("source", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_documents_are_refused_in_bounded_time_and_memory(source: str) -> None:
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(SsmlError) as caught:
            parse_ssml(source)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.code == "invalid_ssml"
    # Bounds with a wide margin (the benchmark measures: bench/bench_ssml.py): no expansion, no
    # walk of every tag, no copy per tag.
    assert elapsed < 2.0
    assert peak < 8 * len(source.encode()) + (4 << 20)


# ---------------------------------------------------------------- stream_text's cutter

DOCUMENT = (
    '<speak xml:lang="en-US">Hello there. How <prosody rate="150%">are. you?</prosody> fine'
    '<break time="1s"/> ok. Then<s>A s. B</s>end <sub alias="a. b">x</sub>! Last</speak>'
)
PIECES = [
    '<speak xml:lang="en-US">Hello there. </speak>',
    '<speak xml:lang="en-US">How <prosody rate="150%">are. you?</prosody> fine<break time="1s"/> ok. </speak>',
    '<speak xml:lang="en-US">Then<s>A s. B</s></speak>',
    '<speak xml:lang="en-US">end <sub alias="a. b">x</sub>! </speak>',
    '<speak xml:lang="en-US">Last</speak>',
]


def _cut(fragments: list[str], max_chars: int = 1000) -> list[str]:
    from indextts_client._ssml._cut import SsmlSplitter

    splitter = SsmlSplitter(max_chars)
    out = [piece for fragment in fragments for piece in splitter.add(fragment)]
    last = splitter.finish()
    return [*out, last] if last else out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_cutter_never_splits_a_tag_or_an_element(size: int) -> None:
    fragments = [DOCUMENT[i : i + size] for i in range(0, len(DOCUMENT), size)]
    pieces = _cut(fragments)
    assert pieces == PIECES
    for piece in pieces:
        parse_ssml(piece)  # each a whole document


def test_cutter_without_a_speak_root_and_its_bounds() -> None:
    assert _cut(["One. Two <break/>three."]) == ["<speak>One. </speak>", "<speak>Two <break/>three.</speak>"]
    with pytest.raises(SsmlError, match="without closing"):
        _cut(["<speak><prosody rate='fast'>" + "word " * 30], max_chars=50)
    with pytest.raises(SsmlError, match="inside a tag"):
        _cut(["<speak>a <break time='1s'"])
    long = _cut(["<speak>" + "word " * 30], max_chars=50)
    assert all(len(piece) <= 2 * 50 + len("<speak></speak>") + 1 for piece in long) and len(long) > 2


# ---------------------------------------------------------------- renderings


def _render(source: str, engine: str, **kwargs: Any) -> list[Any]:
    from indextts_client._ssml._render import Segment, render

    out: list[Any] = []
    for step in render(parse_ssml(source, strict=kwargs.get("strict", True)), engine, None, **kwargs):
        out.append((step.text, dict(step.options), step.voice) if isinstance(step, Segment) else step.seconds)
    return out


def test_renderings_per_engine() -> None:
    going = '<speak>we <phoneme alphabet="x-arpabet" ph="g ow1">going</phoneme> <break time="1s"/>银'
    going += '<phoneme alphabet="pinyin" ph="hang2">行</phoneme></speak>'
    assert _render(going, "indextts2.5") == [("we <going|G OW1> ", {}, None), 1, ("银<行|HANG2>", {}, None)]
    assert _render(going, "fake") == _render(going, "indextts2.5")
    with pytest.raises(SsmlError) as caught:
        _render(going, "indextts2")  # ARPAbet: refused
    assert (caught.value.code, caught.value.tag, caught.value.column) == ("unsupported", "phoneme", 11)
    pinyin = '<speak>银<phoneme alphabet="pinyin" ph="hang2">行</phoneme></speak>'
    assert _render(pinyin, "indextts2") == [("银HANG2", {}, None)]
    assert _render(pinyin, "indextts") == [("银HANG2", {}, None)]
    with pytest.raises(SsmlError, match="espeak cannot read it"):
        _render(pinyin, "espeak")
    assert _render(pinyin, "espeak", strict=False) == [("银行", {}, None)]
    lang = '<speak xml:lang="en">Hi <lang xml:lang="zh-CN">你好</lang></speak>'
    assert _render(lang, "espeak", voice="en-us") == [("Hi ", {}, "en-us"), ("你好", {}, "zh-cn")]
    assert _render(lang, "indextts2.5") == [("Hi ", {"lang": "en"}, None), ("你好", {"lang": "zh"}, None)]
    with pytest.raises(SsmlError) as caught:
        _render('<speak><lang xml:lang="fr">oui</lang></speak>', "indextts2")
    assert (caught.value.tag, caught.value.attribute) == ("lang", "xml:lang")
    with pytest.raises(SsmlError, match="no speed control"):
        _render('<speak><prosody rate="fast">x</prosody></speak>', "indextts2")


def test_text_cannot_forge_a_pronunciation_mark() -> None:
    forged = "<speak>say &lt;going|G OW1&gt; now</speak>"
    with pytest.raises(SsmlError) as caught:
        _render(forged, "indextts2.5")
    assert (caught.value.code, caught.value.line, caught.value.column) == ("unsupported", 1, 8)
    assert _render(forged, "indextts2.5", strict=False) == [("say \u2039going|G OW1\u203a now", {}, None)]
    assert _render(forged, "espeak") == [("say <going|G OW1> now", {}, None)]  # espeak reads no marks


def test_a_flush_never_splits_a_tag_or_an_element() -> None:
    from indextts_client._ssml._cut import SsmlSplitter

    splitter = SsmlSplitter(1000)
    assert splitter.add('<speak>a <prosody rate="fast">b <break time="1') == []
    assert splitter.flush() == ""  # inside a tag: held
    assert splitter.add('s"/>c') == []
    assert splitter.flush() == ""  # inside <prosody>: held
    assert splitter.add("</prosody> d") == []
    assert splitter.flush() == '<speak>a <prosody rate="fast">b <break time="1s"/>c</prosody> d</speak>'
    assert splitter.add("e</speak>") == []
    assert splitter.finish() == "<speak>e</speak>"

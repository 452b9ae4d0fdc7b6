"""Numbers as words, for ``<say-as interpret-as="cardinal|ordinal|digits">``: English and Chinese.

No library covers both (num2words has no Chinese), and the rules are short: English in groups
of three (``twenty-one``, ``one thousand and five`` is not used: ``one thousand five``), Chinese
in groups of four with 万 and 亿, a 零 for each run of zeros inside, 十 rather than 一十 in front.
"""

from __future__ import annotations

__all__ = ["MAX_DIGITS", "cardinal", "digits", "ordinal"]

#: The longest integer spelled out: 15 digits (under a thousand trillion).
MAX_DIGITS = 15

_EN_ONES = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"),
)
_EN_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_EN_SCALES = ("", " thousand", " million", " billion", " trillion")
_EN_ORDINAL = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_ZH_DIGITS = "零一二三四五六七八九"
_ZH_UNITS = ("", "十", "百", "千")
_ZH_GROUPS = ("", "万", "亿", "万亿")


def _en_below_thousand(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    words = [f"{_EN_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_EN_ONES[rest])
    return " ".join(words)


def _en_cardinal(n: int) -> str:
    if n == 0:
        return "zero"
    groups = []
    scale = 0
    while n:
        n, group = divmod(n, 1000)
        if group:
            groups.append(_en_below_thousand(group) + _EN_SCALES[scale])
        scale += 1
    return " ".join(reversed(groups))


def _zh_below_10000(n: int) -> str:
    out: list[str] = []
    zero = False
    for place in (3, 2, 1, 0):
        digit = n // 10**place % 10
        if digit == 0:
            zero = bool(out)
            continue
        if zero:
            out.append("零")
            zero = False
        out.append(_ZH_DIGITS[digit] + _ZH_UNITS[place])
    return "".join(out)


def _zh_cardinal(n: int) -> str:
    if n == 0:
        return "零"
    groups: list[int] = []
    while n:
        n, group = divmod(n, 10000)
        groups.append(group)
    out: list[str] = []
    pending_zero = False
    for index in range(len(groups) - 1, -1, -1):
        group = groups[index]
        if group == 0:
            pending_zero = bool(out)
            continue
        if out and (pending_zero or group < 1000):
            out.append("零")
        out.append(_zh_below_10000(group) + _ZH_GROUPS[index])
        pending_zero = False
    text = "".join(out)
    return text[1:] if text.startswith("一十") else text  # 十五, not 一十五


def _chinese(lang: str) -> bool:
    return lang.lower().split("-")[0] in ("zh", "cmn", "yue")


def cardinal(n: int, lang: str) -> str:
    """``n`` in words (``-`` reads "minus" / 负)."""
    if n < 0:
        return ("负" if _chinese(lang) else "minus ") + cardinal(-n, lang)
    return _zh_cardinal(n) if _chinese(lang) else _en_cardinal(n)


def ordinal(n: int, lang: str) -> str:
    """``n`` as an ordinal: "twenty-first", 第二十一."""
    if _chinese(lang):
        return "第" + _zh_cardinal(n)
    words = _en_cardinal(n)
    head, sep, last = words.rpartition(" ")
    lead, dash, unit = last.rpartition("-")
    if unit in _EN_ORDINAL:
        unit = _EN_ORDINAL[unit]
    elif unit.endswith("y"):
        unit = unit[:-1] + "ieth"
    else:
        unit += "th"
    return head + sep + lead + dash + unit


def digits(text: str, lang: str) -> str:
    """Each digit of ``text`` as its own word; other characters kept."""
    zh = _chinese(lang)
    out = []
    for char in text:
        if char.isdigit() and char.isascii():
            out.append(_ZH_DIGITS[int(char)] if zh else _EN_ONES[int(char)])
        elif not char.isspace():
            out.append(char)
    return ("" if zh else " ").join(out)

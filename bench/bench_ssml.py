"""The SSML reader: throughput on a realistic 64 KiB document, and the time to refuse hostile ones.

::

    python bench/bench_ssml.py [--rounds 9]

Reads a 64 KiB document of every supported tag (sentences, breaks, prosody, phonemes, say-as,
sub, lang, entities, some Chinese) with :func:`indextts_client._ssml.parse_ssml` on one core,
``--rounds`` times, and prints the median and best MB/s (goal: at least 1 MB/s).  Then each
hostile document of the test battery (deep nesting, 100,000 tags, entity expansion, a year of
breaks, a 500 KB attribute, over a megabyte), the median and worst milliseconds to its typed
refusal (goal: under 50 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from indextts_client._ssml import SsmlError, parse_ssml

_PARAGRAPH = (
    '<p><s>Welcome back to the <sub alias="World Wide Web">WWW</sub> show, episode '
    '<say-as interpret-as="cardinal">1,234</say-as>.</s><break time="300ms"/>'
    '<s><prosody rate="120%">Today we are <phoneme alphabet="x-arpabet" ph="G OW1 . IH0 NG">going</phoneme> '
    'fast &amp; far</prosody>, the <say-as interpret-as="ordinal">3</say-as> time.</s>'
    '<s>Call <say-as interpret-as="digits">5550199</say-as> or spell <say-as interpret-as="characters">IBM</say-as>.'
    '</s><break strength="strong"/><lang xml:lang="zh-CN">我们去银<phoneme alphabet="pinyin" ph="hang2">行</phoneme>'
    '\uff0c第<say-as interpret-as="cardinal">15</say-as>次。</lang></p>\n'
)


def document(size: int = 64 * 1024) -> str:
    """About ``size`` bytes of SSML (UTF-8), breaks kept under the 60 s bound by their count."""
    body = []
    length = 0
    index = 0
    while length < size - 200:
        paragraph = _PARAGRAPH if index % 20 else _PARAGRAPH.replace('<break time="300ms"/>', "")
        body.append(paragraph.replace('time="300ms"', 'time="1ms"').replace('strength="strong"', 'time="2ms"'))
        length += len(body[-1].encode())
        index += 1
    return "<speak>" + "".join(body) + "</speak>"


def _hostile() -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "client"))
    from test_ssml_reader import HOSTILE

    return dict(HOSTILE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    source = document()
    size = len(source.encode())
    plan = parse_ssml(source)  # warm, and check it reads
    runs = sum(1 for item in plan.items if hasattr(item, "text"))
    times = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        parse_ssml(source)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(
        f"read {size} bytes ({runs} runs, {len(plan.items) - runs} breaks): median {median * 1000:.1f} ms, "
        f"{size / median / 1e6:.2f} MB/s (best {size / min(times) / 1e6:.2f} MB/s), goal >= 1 MB/s"
    )
    for name, hostile in _hostile().items():
        times = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            try:
                parse_ssml(hostile)
            except SsmlError:
                pass
            else:
                raise SystemExit(f"{name}: not refused")
            times.append(time.perf_counter() - started)
        print(
            f"refused {name} ({len(hostile.encode())} bytes): median {statistics.median(times) * 1000:.2f} ms, "
            f"worst {max(times) * 1000:.2f} ms, goal < 50 ms"
        )


if __name__ == "__main__":
    main()

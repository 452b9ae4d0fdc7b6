"""The sentence splitter under stream_text: seconds per text size, for hostile texts.

::

    python bench/bench_splitter.py [--rounds 5]

:class:`indextts_client._sentences.SentenceSplitter` on 80 KB and 800 KB of each text (one
fragment: the worst case), the sizes taking turns round by round; it should cost 10x for 10x
the text.  For comparison, sentence-stream's detector handed the whole text at once, as
stream_text used it before (then cut at 1,000 characters by handing the rest back), on 4 and
8 KB only: it grows with the cube of the text.  Prints the median and the spread per size.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from sentence_stream import SentenceBoundaryDetector

from indextts_client._sentences import SentenceSplitter

TEXTS = {
    "A. A. ...": "A. ",
    "dots": ".",
    "words": "word ",
    "sentences": "It is one. ",
}


def splitter(text: str) -> None:
    s = SentenceSplitter(1000)
    s.add(text)
    s.finish()


def before(text: str) -> None:
    """stream_text's loop before the splitter: the whole fragment, then cuts handed back whole."""
    detector = SentenceBoundaryDetector()
    list(detector.add_chunk(text))
    while len(detector.current_sentence) + len(detector.remaining_text) > 1000:
        pending = detector.finish()
        cut = pending[:1001].rfind(" ")
        cut = cut if cut > 0 else 1000
        list(detector.add_chunk(pending[cut:].lstrip()))
    detector.finish()


def timed(run: Callable[[str], None], text: str) -> float:
    started = time.perf_counter()
    run(text)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for name, unit in TEXTS.items():
        for label, run, sizes in (("splitter", splitter, (80_000, 800_000)), ("before", before, (4_000, 8_000))):
            times: dict[int, list[float]] = {size: [] for size in sizes}
            for _ in range(args.rounds):  # the sizes take turns
                for size in sizes:
                    times[size].append(timed(run, unit * (size // len(unit))))
            cells = [
                f"{size // 1000} KB {statistics.median(t):.3f} s ({min(t):.3f}-{max(t):.3f})"
                for size, t in times.items()
            ]
            small, large = (statistics.median(times[size]) for size in sizes)
            print(f"{name:10} {label:8} " + "; ".join(cells) + f"; x{large / small:.1f} for x{sizes[1] // sizes[0]}")


if __name__ == "__main__":
    main()

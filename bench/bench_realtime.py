"""stream_text in real time: the latency to a sentence's first audio, and the silence between sentences.

    .venv/bin/python bench/bench_realtime.py [--rounds 5] [--chunk 0.25] [--backend asyncio|trio]

The fake engine is paced at real time: every chunk of ``--chunk`` seconds of audio takes
``--chunk`` seconds to compute (its ``delay`` option), so its own first-chunk time is
``--chunk``.  A simulated LLM writes the text in 4-character fragments, one every 5 ms
(faster than speech, as an LLM is), into a :class:`TextFeed`.

* **first audio**: from the moment the fragment that completes sentence 0 is handed over
  (the sentence splitter can cut it then; which fragment that is comes from running the
  same splitter over the fragments beforehand) to its first chunk in the caller's hands,
  minus the engine's first-chunk time: what stream_text adds.  Goal: under 10 ms.
* **gap**: between the last chunk of sentence N and the first of N+1, minus the engine's
  first-chunk time: the silence stream_text adds between sentences.  With ``lookahead``
  (the default, 2) the next sentence is already queued on the sidecar; ``lookahead=0``
  (each sentence sent once the one before ended) is measured alongside, as the yardstick.

Both variants run in the same sidecar, taking turns each round (order alternating); the
figures are medians over rounds and sentences, with min-max.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentence_stream import SentenceBoundaryDetector

from indextts_client import Client, SentenceChunk, TextFeed

TEXT = "The kettle is on. Tea will be ready soon. Shall I bring biscuits? The blue tin, I think. Enjoy it."
FRAGMENT = 4
EVERY = 0.005


def fragments() -> list[str]:
    return [TEXT[i : i + FRAGMENT] for i in range(0, len(TEXT), FRAGMENT)]


def cutting_fragment() -> int:
    """The index of the fragment after which the splitter emits the first sentence."""
    detector = SentenceBoundaryDetector()
    for index, piece in enumerate(fragments()):
        if list(detector.add_chunk(piece)):
            return index
    raise AssertionError("the text has no second sentence")


async def one_round(client: Client, lookahead: int, chunk: float) -> tuple[float, list[float]]:
    feed = TextFeed()
    sent_at: list[float] = []
    cut = cutting_fragment()

    async def write() -> None:
        for piece in fragments():
            await feed.send(piece)
            sent_at.append(anyio.current_time())
            await anyio.sleep(EVERY)
        feed.close()

    firsts: dict[int, float] = {}
    lasts: dict[int, float] = {}
    async with (
        anyio.create_task_group() as tg,
        client.stream_text(feed, lookahead=lookahead, delay=chunk) as stream,
    ):
        tg.start_soon(write)
        async for item in stream:
            now = anyio.current_time()
            assert isinstance(item, SentenceChunk)
            firsts.setdefault(item.sentence, now)
            lasts[item.sentence] = now
    first_audio = firsts[0] - sent_at[cut] - chunk
    gaps = [firsts[n + 1] - lasts[n] - chunk for n in range(len(firsts) - 1)]
    return first_audio, gaps


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):7.2f} ms ({min(ms):.2f} .. {max(ms):.2f})"


async def main_async(args: argparse.Namespace) -> None:
    results: dict[int, dict[str, list[float]]] = {2: {"first": [], "gap": []}, 0: {"first": [], "gap": []}}
    options: dict[str, Any] = {"chunk_seconds": args.chunk}
    async with Client("fake", engine_options=options, ready_timeout=60) as client:
        await client.load()
        await one_round(client, 2, args.chunk)  # warm-up: imports, caches
        for round_ in range(args.rounds):
            order = (2, 0) if round_ % 2 == 0 else (0, 2)
            for lookahead in order:
                first, gaps = await one_round(client, lookahead, args.chunk)
                results[lookahead]["first"].append(first)
                results[lookahead]["gap"].extend(gaps)
    print(
        f"{args.rounds} rounds on {args.backend}, fake engine at real time ({args.chunk:g} s chunks), "
        f"{len(TEXT)} characters in {FRAGMENT}-character fragments every {EVERY * 1000:g} ms; "
        "median (min .. max) beyond the engine's first-chunk time:"
    )
    for lookahead in (2, 0):
        row = results[lookahead]
        print(f"  lookahead={lookahead}: first audio {summary(row['first'])}   gap {summary(row['gap'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunk", type=float, default=0.25, help="seconds of audio per chunk, and per compute")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()
    anyio.run(main_async, args, backend=args.backend)


if __name__ == "__main__":
    main()

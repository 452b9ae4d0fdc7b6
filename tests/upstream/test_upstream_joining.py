"""Requests joining a running batch (continuous batching) against the real upstream code.

With greedy decoding and a seed, a request that joins a batch mid-way must sound as it does
alone, and so must the request it joined: the same tolerance as tests/upstream/
test_upstream_batching.py (at most one int16 step, on at most 1% of a request's samples; a
decoding that drifted differs everywhere).  A lone request, which the sidecar now runs
through the batch path as a batch of one, must sound as upstream's own generator makes it.

Two ways: the adapter driven in process by ``probe_joining.py`` in upstream's venv, where the
test decides exactly when a request joins (the second when the first has one segment out, so
the first is at its 2nd; the third when it has two, at its 3rd), and a real sidecar through
the public Client, where a request is sent once another's progress says its first segment is
out (a real happened-before) and joins it at its next step.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from conftest import HERE, ROOT, Flavour, flavour_named

from indextts_client import Audio, Client, ProgressEvent

#: Each test loads a model and runs six to nine requests: a minute or two on two busy cores.
pytestmark = pytest.mark.timeout(900)

#: Samples (of each request) allowed to differ by one int16 step; none may differ by more.
SHARE = 0.01


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def assert_equal_audio(alone: np.ndarray, other: np.ndarray) -> None:
    a, b = alone.astype(np.int32), other.astype(np.int32)
    assert a.shape == b.shape and a.size > 0, (a.shape, b.shape)
    difference = np.abs(a - b)
    assert int(difference.max()) <= 1, int(difference.max())
    assert np.count_nonzero(difference) <= SHARE * a.size, np.count_nonzero(difference)
    assert int(np.abs(a).max()) > 1000  # audio, not silence: random weights are loud


def batch_notes(messages: list[str]) -> list[str]:
    return [m for m in messages if m.startswith(("in a batch of", "joined a batch of"))]


@pytest.mark.parametrize("name", ["2", "2.5"])
def test_a_request_that_joins_mid_way_sounds_as_alone_and_so_does_a_lone_batch(
    name: str, checkpoints: Any, tmp_path: Path
) -> None:
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    out = tmp_path / "probe"
    done = subprocess.run(
        [flavour.python, str(HERE / "probe_joining.py"), name, str(ckpt), str(out)],
        env={**os.environ, **flavour.env()},
        capture_output=True,
        text=True,
        timeout=840,
        cwd=str(ROOT),
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())

    def audio(way: str, i: int) -> np.ndarray:
        return np.load(out / f"{way}-{i}.npy")

    assert report["alone"][0]["ready"] >= 3  # the first has a 3rd segment for the third to join at
    for i in range(3):
        # A batch of one is upstream's generator alone: its audio, its progress, its facts.
        assert_equal_audio(audio("alone", i), audio("lone", i))
        assert batch_notes(report["lone"][i]["messages"]) == []
        assert report["lone"][i]["facts"]["voice_cache"] in ("hit", "miss")
        assert set(report["lone"][i]["facts"]["stages"]) == set(report["alone"][i]["facts"]["stages"])
        assert report["lone"][i]["ready"] == report["alone"][i]["ready"]
        # Joined mid-way, or joined by others: each sounds as alone.
        assert_equal_audio(audio("alone", i), audio("joined", i))
        assert report["joined"][i]["facts"]["voice_cache"] in ("hit", "miss")
    assert all(room == 3 for room in report["lone_join_calls"])  # max_batch 4, one running

    order = report["order"]
    joined = report["joined"]
    assert batch_notes(joined[0]["messages"]) == []  # started alone; the others said they joined
    for i, segments_out in ((1, 1), (2, 2)):
        at = order.index(f"join {i}")
        # It joined while the first ran, after the first's segments before it (its notes say it
        # shared the batch's steps).  Its audio need not come before the first's end: on the
        # CPU (batch_stages auto: gpt) each request's CFM and vocoder run as its own codes are
        # ready, so the first, a step ahead, may finish before the joiner's first audio.
        assert order.index("end 0") > at and order.index(f"audio {i}") > at
        assert order[:at].count("audio 0") >= segments_out
        notes = batch_notes(joined[i]["messages"])
        assert len(notes) == 1 and notes[0] in ("joined a batch of 2", "joined a batch of 3"), notes
    # The room each join was offered: max_batch less the requests running then.
    assert report["rooms"][0] == 3 and min(report["rooms"]) >= 1


def jobs(ckpt: Path, name: str) -> list[tuple[str, dict[str, Any]]]:
    """probe_joining.py's three requests: greedy, a seed each, the first of four segments."""
    voice, voice2 = str(ckpt / "voice.wav"), str(ckpt / "voice2.wav")
    options = {"do_sample": False, "max_mel_tokens": 12, "max_text_tokens_per_segment": 6 if name == "2" else 20}
    return [
        ("Hello there. This is a test. We speak slowly. One two three.", {"voice": voice, "seed": 2, **options}),
        ("We speak slowly and clearly.", {"voice": voice2, "seed": 3, **options}),
        ("Hello there, one two three.", {"voice": voice, "seed": 5, **options}),
    ]


def joining_client(flavour: Flavour, ckpt: Path, **engine_options: Any) -> Client:
    options: dict[str, Any] = {"model_dir": str(ckpt), "device": "cpu", "max_batch": 4, "use_qwen_emo": False}
    options.update(engine_options)
    return Client(
        flavour.engine,
        python=flavour.python,
        engine_options=options,
        env=flavour.env(),
        ready_timeout=60,
        idle_timeout=300,
    )


def ready_segments(events: list[ProgressEvent]) -> int:
    return sum(1 for e in events if e.message.startswith("segment ") and " ready (" in e.message)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["2", "2.5"])
async def test_through_a_sidecar_requests_sent_while_one_runs_join_it_and_sound_as_alone(
    name: str, checkpoints: Any
) -> None:
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    requests = jobs(ckpt, name)
    async with joining_client(flavour, ckpt) as c:
        await c.load()
        assert c.info.max_batch == 4
        alone = []
        for text, options in requests:
            events: list[ProgressEvent] = []
            alone.append(await c.synthesize(text, on_progress=events.append, **options))
            assert batch_notes([e.message for e in events]) == []  # a batch of one says nothing of batches

        results: list[Any] = [None] * 3
        events_of: list[list[ProgressEvent]] = [[], [], []]
        timeline: list[tuple[int, str]] = []  # every request's progress, in the order it came
        # The second is sent once the first has one segment out, the third once it has two.
        out = [anyio.Event(), anyio.Event()]

        def recorder(i: int) -> Any:
            def progress(event: ProgressEvent) -> None:
                events_of[i].append(event)
                timeline.append((i, event.message))
                for k in range(min(ready_segments(events_of[0]), 2) if i == 0 else 0):
                    out[k].set()

            return progress

        async def one(i: int) -> None:
            if i:
                await out[i - 1].wait()
            text, options = requests[i]
            results[i] = await c.synthesize(text, on_progress=recorder(i), **options)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)

    for i in range(3):
        assert isinstance(results[i], Audio), results[i]
        assert_equal_audio(alone[i].samples, results[i].samples)
    assert batch_notes([e.message for e in events_of[0]]) == []
    for i in (1, 2):
        notes = batch_notes([e.message for e in events_of[i]])
        assert len(notes) == 1 and notes[0] in ("joined a batch of 2", "joined a batch of 3"), notes
    # Each joined the first mid-way: it said so before the first's last segment was out.  (Its own
    # first segment may come after that: on the CPU, batch_stages auto is gpt, and the first,
    # a step ahead, runs its CFM and vocoder as soon as its codes are ready.)
    firsts_last = max(k for k, (i, message) in enumerate(timeline) if i == 0 and " ready (" in message)
    assert ready_segments(events_of[0]) == 4
    for i in (1, 2):
        joined = min(k for k, (j, message) in enumerate(timeline) if j == i and message.startswith("joined a batch"))
        assert joined < firsts_last, timeline


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["2", "2.5"])
async def test_a_short_first_segment_is_cut_from_upstreams_first_at_a_word_boundary(
    name: str, checkpoints: Any
) -> None:
    """``first_segment_tokens``: the first segment of upstream's segmenter cut in two between
    words, the rest as upstream cut it, through the batch path (a lone request joins nothing).
    A request that streams (``request()``) and sets none gets STREAM_FIRST_SEGMENT_TOKENS (10);
    ``synthesize()``, or an explicit 0, keeps upstream's segments.  With 2's tiny tokenizer a token
    is about a word, with 2.5's about a character."""
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    first = 3 if name == "2" else 12
    text = "Hello there this is a test of the first segment that we cut short. We speak slowly."
    options = {"voice": str(ckpt / "voice.wav"), "do_sample": False, "seed": 1, "max_mel_tokens": 6}

    async def streamed(c: Client, **more: Any) -> Audio:
        async with c.request(text, **options, **more) as req:
            return await req.result()

    with anyio.fail_after(300):
        async with joining_client(flavour, ckpt) as c:
            short = await c.synthesize(text, first_segment_tokens=first, **options)
            plain = await c.synthesize(text, **options)
            stream_default = await streamed(c)
            stream_off = await streamed(c, first_segment_tokens=0)
    whole = [w.word for w in plain.words]
    assert [w.word for w in stream_off.words] == whole
    for audio in (short, stream_default):
        cut = [w.word for w in audio.words]
        assert all(w.segment for w in audio.words) and len(cut) == len(whole) + 1, (cut, whole)
        assert f"{cut[0]} {cut[1]}" == whole[0] and cut[2:] == whole[1:], (cut, whole)
        assert 0 < len(cut[0].split()) < len(whole[0].split())
        assert audio.samples.size > 0
    # The default is 10 tokens: with 2's tokenizer more words than 3 tokens hold, at most 10; with
    # 2.5's (its normaliser lower-cases), the two words that 10 tokens hold.
    said = stream_default.words[0].word.split()
    assert (3 < len(said) <= 10) if name == "2" else said == ["hello", "there"], said
    assert plain.samples.size > 0

"""IndexTTSInProcessService (a Client in process) in Pipecat's own pipeline, with the espeak engine.

The reference is the same Client's ``stream_text`` of the sentences Pipecat cut, each flushed.
espeak-ng's audio for one text varies by up to 0.5% of its length run to run: lengths are
compared within 5%.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from typing import Any, Union

import pytest

pytest.importorskip("pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs it")
pytest.importorskip("espeakng_loader", reason="the espeak engine's library (extra espeak) is not installed")

from pipecat.frames.frames import (
    AggregatedTextFrame,
    ErrorFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.tts_service import TextAggregationMode
from pipecat_support import RATE, Collector, Speaker, running

from indextts_client import FLUSH, Client, Pool
from indextts_client.integrations.pipecat import IndexTTSInProcessService

pytestmark = pytest.mark.anyio

REPLY = "The museum opens at nine. Tickets are twelve euros, and children go free."


@pytest.fixture(params=["client", "pool"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Union[Client, Pool]]:
    """A Client of the espeak engine, or a Pool of one (its stream_text leases the member)."""
    if request.param == "client":
        async with Client("espeak") as c:
            yield c
    else:
        async with Pool("espeak", size=1) as p:
            yield p


def words_of(text: str) -> list[str]:
    return re.findall(r"[A-Za-z']+", text)


async def reply_turn(worker: Any, text: str) -> None:
    await worker.queue_frame(LLMFullResponseStartFrame())
    for i in range(0, len(text), 3):
        await worker.queue_frame(LLMTextFrame(text[i : i + 3]))
    await worker.queue_frame(LLMFullResponseEndFrame())


def ended(frames: list[Any]) -> bool:
    return any(isinstance(f, LLMFullResponseEndFrame) for f in frames)


@pytest.mark.parametrize("mode", [TextAggregationMode.SENTENCE, TextAggregationMode.TOKEN])
async def test_a_whole_reply_is_spoken_with_its_words(client: Union[Client, Pool], mode: TextAggregationMode) -> None:
    # TOKEN: Pipecat hands each token over as it comes, and stream_text cuts the sentences.
    tts = IndexTTSInProcessService(client, sample_rate=RATE, text_aggregation_mode=mode)
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await reply_turn(worker, REPLY)
        await down.wait_for(ended, "end of the reply")
    assert up.of(ErrorFrame) == []
    sentences = ["The museum opens at nine.", "Tickets are twelve euros, and children go free."]
    announced = [f.text for f in down.of(AggregatedTextFrame) if f.will_be_spoken and not isinstance(f, TTSTextFrame)]
    assert [a.strip() for a in announced] == sentences  # TOKEN: Pipecat keeps the space between them
    audio = b"".join(f.audio for f in down.of(TTSAudioRawFrame))
    fragments: list[Any] = [part for s in sentences for part in (s, FLUSH)]
    reference = bytearray()
    async with client.stream_text(fragments, sample_rate=RATE) as chunks:
        async for chunk in chunks:
            reference += chunk.samples.tobytes()
    assert len(reference) > RATE
    assert abs(len(audio) - len(reference)) <= 0.05 * len(reference)
    assert len(down.of(TTSStoppedFrame)) == 1
    words = down.of(TTSTextFrame)
    assert words_of(" ".join(f.text for f in words)) == words_of(REPLY)
    # One frame per word, timed: strictly later presentation times, within the audio's length.
    assert len(words) == len(words_of(REPLY))
    pts = [f.pts for f in words]
    assert all(a < b for a, b in itertools.pairwise(pts))
    assert (pts[-1] - pts[0]) / 1e9 < len(audio) / 2 / RATE


async def test_an_interruption_cuts_the_transcript_at_the_word_heard(client: Union[Client, Pool]) -> None:
    tts = IndexTTSInProcessService(client, sample_rate=RATE)
    context = LLMContext()
    assistant = LLMContextAggregatorPair(context).assistant()
    speaker = Speaker()
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    first = "The museum opens at nine."
    async with running([up, tts, speaker, down, assistant]) as worker:
        await worker.queue_frame(LLMFullResponseStartFrame())
        for i in range(0, len(first + " Tickets are twelve"), 3):
            await worker.queue_frame(LLMTextFrame((first + " Tickets are twelve")[i : i + 3]))
        await speaker.wait_played(int(0.6 * RATE))
        await worker.queue_frame(InterruptionFrame())
        await reply_turn(worker, "Yes.")
        await down.wait_for(ended, "the next reply")
    assert up.of(ErrorFrame) == []
    health = await client.ping()
    members = health if isinstance(health, list) else [health]
    assert [h.queue_depth for h in members] == [0]  # nothing of the interrupted turn left on the sidecar
    heard = speaker.heard
    assert heard is not None and 0.6 * RATE <= heard < 1.0 * RATE
    reference = await client.synthesize(first, sample_rate=RATE)
    starts = [w.start for w in reference.words]
    assert len(starts) == len(words_of(first))
    said = [m["content"] for m in context.get_messages() if m["role"] == "assistant"]
    assert len(said) == 2 and words_of(said[1]) == ["Yes"]
    kept = words_of(said[0])
    assert kept == words_of(first)[: len(kept)] and 0 < len(kept) < len(starts)
    played = sum(1 for start in starts if start < heard / RATE)
    assert abs(len(kept) - played) <= 1, (kept, played, starts, heard / RATE)


async def test_a_failed_turn_surfaces_as_an_error_frame(client: Union[Client, Pool]) -> None:
    tts = IndexTTSInProcessService(client, sample_rate=RATE, voice="no-such-voice")
    up, down = Collector(FrameDirection.UPSTREAM), Collector()
    async with running([up, tts, down]) as worker:
        await worker.queue_frame(TTSSpeakFrame("Hello there."))
        await up.wait_for(lambda fs: any(isinstance(f, ErrorFrame) for f in fs), "an error")
        await down.wait_for(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs), "the turn's end")
    assert down.of(TTSAudioRawFrame) == []
    errors = [f.error for f in up.of(ErrorFrame)]
    assert any("no-such-voice" in e for e in errors), errors

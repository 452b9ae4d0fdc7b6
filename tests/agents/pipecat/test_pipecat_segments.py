"""IndexTTS gives no word timings: its segments stand in (the IndexTTS stand-in of
tests/standin behind ``serve --engine indextts2``), and the service times each segment's words
at the segment's start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import STANDIN
from http_support import environ, server

pytest.importorskip("pipecat.frames.frames", reason="pipecat-ai is not installed: `bash .ci/agents` runs it")

from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame, TTSTextFrame
from pipecat.processors.frame_processor import FrameDirection
from pipecat_support import Collector, running

from indextts_client.integrations.pipecat import IndexTTSService

pytestmark = pytest.mark.anyio

#: The stand-in cuts "a b c d e" two words a segment, 0.1 s a word and 0.1 s of silence after
#: each segment, at 22,050 Hz (tests/serving/test_word_alignment.py).
SEGMENTED = {"max_text_tokens_per_segment": 2, "interval_silence": 100}
RATE = 22050


async def test_segments_stand_in_for_words(ckpt: Path, voice: str) -> None:
    env = environ(PYTHONPATH=os.pathsep.join([str(STANDIN / "v2"), os.environ.get("PYTHONPATH", "")]))
    args = ("--engine", "indextts2", "-O", f"model_dir={ckpt}", "--voice", f"alloy={voice}")
    with server(*args, env=env) as s:
        tts = IndexTTSService(url=s.base, voice="alloy", sample_rate=RATE, options=SEGMENTED)
        up, down = Collector(FrameDirection.UPSTREAM), Collector()
        async with running([up, tts, down], sample_rate=RATE) as worker:
            await worker.queue_frame(TTSSpeakFrame("a b c d e"))
            await down.wait_for(lambda fs: any(isinstance(f, TTSStoppedFrame) for f in fs), "the turn's end")
    assert up.of(ErrorFrame) == []
    assert sum(len(f.audio) for f in down.of(TTSAudioRawFrame)) == 2 * 15435
    # Each segment's words (the engine's own text, upper-cased by the stand-in) at the segment's
    # first sample: 0, 6615 and 13230 samples.
    words = down.of(TTSTextFrame)
    assert [f.text for f in words] == ["A", "B", "C", "D", "E"]
    first = words[0].pts
    assert [round((f.pts - first) / 1e9 * RATE) for f in words] == [0, 0, 6615, 6615, 13230]

"""A LiveKit ``AgentSession`` speaking through the TTS, without a room: the framework's own
transcript synchronizer between the session and a stand-in speaker that plays in real time
(by the clock, as a sound card would), against a real ``serve --engine espeak``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import pytest

pytest.importorskip("livekit.agents")

from http_support import KEY, Server
from livekit import rtc
from livekit.agents import Agent, AgentSession, llm
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities, TextOutput
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer
from livekit_support import WAIT

from indextts_client.integrations.livekit import TTS

pytestmark = pytest.mark.anyio

REPLY = (
    "The museum opens at nine in the morning. Tickets cost twelve euros for adults, "
    "and children under twelve go free. The last entry is at five."
)


class Speaker(AudioOutput):
    """Plays what it is given in real time: its position is the clock's since the first frame."""

    def __init__(self) -> None:
        super().__init__(label="speaker", capabilities=AudioOutputCapabilities(pause=False))
        self.frames: list[rtc.AudioFrame] = []
        self.position: float | None = None  # where playback stopped (interrupted or done)
        self._started = 0.0
        self._queued = 0.0  # seconds given since the first frame
        self._done: asyncio.TimerHandle | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._queued:
            self._started = time.monotonic()
            self.on_playback_started(created_at=time.time())
        self._queued += frame.duration
        self.frames.append(frame)

    def flush(self) -> None:
        super().flush()
        if self._queued:
            left = max(0.0, self._queued - (time.monotonic() - self._started))
            self._done = asyncio.get_running_loop().call_later(left, self._finish, self._queued, False)

    def clear_buffer(self) -> None:
        if self._queued:
            if self._done is not None:
                self._done.cancel()
            self._finish(min(self._queued, time.monotonic() - self._started), True)

    def _finish(self, position: float, interrupted: bool) -> None:
        self.position, self._queued, self._done = position, 0.0, None
        self.on_playback_finished(playback_position=position, interrupted=interrupted)

    def words(self) -> list[Any]:
        """The timed words the frames carried (LiveKit's emitter puts them in their userdata)."""
        return [w for f in self.frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]


class Transcript(TextOutput):
    """The text the synchronizer releases word by word as the audio plays."""

    def __init__(self) -> None:
        super().__init__(label="transcript", next_in_chain=None)
        self.text = ""
        self._changed = asyncio.Event()

    async def capture_text(self, text: str) -> None:
        self.text += text
        self._changed.set()

    def flush(self) -> None:
        pass

    async def until_words(self, n: int) -> None:
        while len(self.text.split()) < n:
            self._changed.clear()
            await self._changed.wait()


async def start_session(server: Server) -> tuple[AgentSession[None], Speaker, Transcript, TranscriptSynchronizer]:
    session = AgentSession[None](tts=TTS(url=server.base, api_key=KEY), use_tts_aligned_transcript=True)
    speaker, transcript = Speaker(), Transcript()
    sync = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=transcript)
    session.output.audio = sync.audio_output
    session.output.transcription = sync.text_output
    await session.start(Agent(instructions="Answer visitors' questions."), record=False)
    return session, speaker, transcript, sync


async def close(session: AgentSession[None], sync: TranscriptSynchronizer) -> None:
    speaker_tts = session.tts
    await session.aclose()
    await sync.aclose()
    if speaker_tts is not None:
        await speaker_tts.aclose()  # the session does not own it


def assistant_messages(session: AgentSession[None]) -> list[llm.ChatMessage]:
    return [item for item in session.history.items if isinstance(item, llm.ChatMessage) and item.role == "assistant"]


async def test_a_whole_reply_is_spoken_with_its_words_in_the_chat_context(espeak: Server) -> None:
    session, speaker, transcript, sync = await start_session(espeak)
    try:
        with anyio.fail_after(WAIT):
            handle = session.say(REPLY)
            await handle.wait_for_playout()
    finally:
        await close(session, sync)
    assert not handle.interrupted
    [message] = assistant_messages(session)
    assert message.text_content == REPLY and not message.interrupted
    assert transcript.text == REPLY
    assert speaker.position == pytest.approx(sum(f.duration for f in speaker.frames))
    print("WORDS", [(str(w), w.start_time, w.end_time) for w in speaker.words()])


async def test_an_interruption_keeps_the_reply_up_to_the_word_heard(espeak: Server) -> None:
    session, speaker, transcript, sync = await start_session(espeak)
    try:
        with anyio.fail_after(WAIT):
            handle = session.say(REPLY)
            await transcript.until_words(5)  # the user talks over the agent mid-sentence
            handle.interrupt()
            await handle.wait_for_playout()
    finally:
        await close(session, sync)
    assert handle.interrupted
    [message] = assistant_messages(session)
    assert message.interrupted
    kept = message.text_content or ""
    print("KEPT", repr(kept), speaker.position, [(str(w), w.start_time) for w in speaker.words()])
    assert kept and REPLY.startswith(kept) and len(kept) < len(REPLY)

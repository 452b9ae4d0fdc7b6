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
from livekit.agents import Agent, AgentSession, APIStatusError, llm
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.agents.voice.events import ErrorEvent
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities, TextOutput
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer
from livekit_support import WAIT, recording_session

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
        self.playing = asyncio.Event()  # set at the first frame

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._queued:
            self._started = time.monotonic()
            self.on_playback_started(created_at=time.time())
        self._queued += frame.duration
        self.frames.append(frame)
        self.playing.set()

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


async def start_session(
    server: Server, voice: str = "alloy", **options: Any
) -> tuple[AgentSession[None], Speaker, Transcript, TranscriptSynchronizer]:
    speaker_tts = TTS(url=server.base, api_key=KEY, voice=voice, **options)
    session = AgentSession[None](tts=speaker_tts, use_tts_aligned_transcript=True)
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
    played = sum(f.duration for f in speaker.frames)
    assert speaker.position == pytest.approx(played)
    # espeak's own word events reached the framework, timed within the audio
    words = speaker.words()
    assert "".join(words) == REPLY
    assert len(words) >= 20  # of 26: espeak-ng reports some pairs as one word ("in the")
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and starts[0] == 0.0
    assert all(w.start_time < w.end_time for w in words)
    assert words[-1].end_time <= played + 1e-6


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
    kept = (message.text_content or "").rstrip()
    assert REPLY.startswith(kept) and REPLY[len(kept)] == " "  # cut at a word boundary
    # the room's transcript may show the word being released as the user spoke, no more
    assert transcript.text.startswith(kept) and len(transcript.text.split()) <= len(kept.split()) + 1
    # within one word of what was played: the words whose audio had all played when it stopped
    # (espeak-ng reports some pairs as one: "in the" counts two)
    assert speaker.position is not None
    heard = "".join(w for w in speaker.words() if w.end_time <= speaker.position)
    assert 4 <= len(kept.split()) < len(REPLY.split())
    assert abs(len(kept.split()) - len(heard.split())) <= 1, (kept, speaker.position, heard)


async def test_a_refused_voice_is_the_sessions_tts_error(espeak: Server) -> None:
    session, speaker, _, sync = await start_session(espeak, voice="nobody-by-this-name")
    errors: list[ErrorEvent] = []
    reported = asyncio.Event()

    def on_error(event: ErrorEvent) -> None:
        errors.append(event)
        reported.set()

    session.on("error", on_error)
    try:
        with anyio.fail_after(WAIT):
            handle = session.say("Never spoken.")
            await handle.wait_for_playout()
            await reported.wait()
    finally:
        await close(session, sync)
    [event] = errors
    assert event.source is session.tts
    assert event.error.type == "tts_error" and not event.error.recoverable
    assert isinstance(event.error.error, APIStatusError)
    assert event.error.error.status_code == 400 and event.error.error.body["code"] == "unknown_voice"
    assert not speaker.frames and not assistant_messages(session)


async def test_an_interruption_cancels_the_reply_still_being_made(fake: Server) -> None:
    # The fake engine sends the first 0.5 s of the reply, then hangs until the request is
    # cancelled: only the interruption reaching the sidecar ends it.
    http, traffic = recording_session()
    hanging = {"chunk_seconds": 0.5, "hang_at": 1}
    session, speaker, _, sync = await start_session(fake, options=hanging, http_session=http)
    try:
        with anyio.fail_after(WAIT):
            handle = session.say(REPLY)
            await speaker.playing.wait()
            handle.interrupt()
            await handle.wait_for_playout()
            [config] = [e for e in traffic.sent() if e["type"] == "context.config"]
            context = config["context_id"]
            assert {"type": "context.cancel", "context_id": context} in traffic.sent()
            await traffic.until(lambda item: item == {"type": "context.cancelled", "context_id": context})
    finally:
        await close(session, sync)
        await http.close()
    assert handle.interrupted
    assert sum(f.duration for f in speaker.frames) <= 0.5 + 1e-6

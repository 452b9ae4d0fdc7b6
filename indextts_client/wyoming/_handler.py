"""One connection's events, and what every connection shares (:class:`WyomingService`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Union

import anyio

from indextts_sidecar import __version__

from .._defaults import DEFAULT_MAX_SILENCE
from .._exceptions import SidecarError
from .._pool._pool import Pool
from .._service import (
    PCM_RATE,
    Backend,
    PoolBackend,
    Prepared,
    Refusal,
    SpeechSettings,
    VoiceSources,
    check_max_silence,
    prepare,
    refusal_of,
)
from .._stream_text import SentenceChunk, TextFeed
from ._framing import BadEvent, invalid, read_event, text_format_of, text_of, voice_of

try:
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.error import Error
    from wyoming.event import Event, async_write_event
    from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"indextts_client.wyoming needs the [wyoming] extra: pip install wyoming sentence-stream ({exc})"
    ) from exc

__all__ = ["DEFAULT_LANGUAGES", "DEFAULT_VOICE_NAME", "Handler", "Limits", "WyomingService"]

log = logging.getLogger("indextts_client.wyoming")
_ATTRIBUTION = Attribution(name="indextts-sidecar", url="https://pypi.org/project/indextts-sidecar/")
#: The languages of a voice whose own are unknown (a clip, an uploaded voice), unless --language
#: says otherwise: IndexTTS-2's.  An engine's own voices carry the languages the engine gives them.
DEFAULT_LANGUAGES = ("en", "zh")
#: The voice listed when nothing else is (the engine's default voice), so that a client can pick one.
DEFAULT_VOICE_NAME = "default"
#: The audio format of every audio event: 16-bit mono.
_WIDTH, _CHANNELS = 2, 1


@dataclass(frozen=True)
class Limits:
    """What one client may make the server hold or wait for (flags in brackets)."""

    #: Connections served at once; one more is answered with an error and closed [--max-connections].
    max_connections: int = 64
    #: Bytes of one event's header line, its data and its payload, each [--max-event-bytes].
    max_event_bytes: int = 64 * 1024
    #: Characters of one request's text: a ``synthesize``, or a whole streamed request [--max-text-chars].
    max_text_chars: int = 20_000
    #: Seconds a connection may stay silent, neither sending an event nor receiving audio [--idle-timeout].
    idle_timeout: float = 60.0
    #: Seconds one event may take to reach a client that does not read [--write-timeout].
    write_timeout: float = 30.0
    #: Seconds the breaks of one SSML request may add up to [--max-silence].
    max_silence: float = DEFAULT_MAX_SILENCE

    def __post_init__(self) -> None:
        check_max_silence(self.max_silence)


def _error(refusal: Refusal) -> Event:
    return Error(refusal.message, code=refusal.code).event()


class WyomingService:
    """What every connection shares: the backend, the voices, the request defaults, the limits."""

    def __init__(
        self,
        backend: Union[Backend, Pool],
        *,
        sources: Union[VoiceSources, None] = None,
        voices: Union[dict[str, Union[str, None]], None] = None,
        languages: Union[Sequence[str], None] = None,
        default_voice: Union[str, None] = None,
        limits: Limits = Limits(),
        options: Union[dict[str, Any], None] = None,
    ) -> None:
        #: The pool behind the backend, when it is one (for tests and health checks).
        self.pool = backend if isinstance(backend, Pool) else None
        self.backend: Backend = PoolBackend(backend) if isinstance(backend, Pool) else backend
        self.sources = sources if sources is not None else VoiceSources(voices or {})
        self.languages = list(languages or DEFAULT_LANGUAGES)
        self.default_voice = default_voice if default_voice is not None else next(iter(self.sources.mapping), None)
        self.limits = limits
        #: Every request's settings before its voice: the engine options (``--set``) for every synthesis.
        self.defaults = SpeechSettings(response_format="wav", options=dict(options or {}))
        #: Connections being served now.
        self.connections = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Until no connection is being served (each one's requests cancelled or finished)."""
        await self._idle.wait()

    def enter(self) -> bool:
        """Take a connection's slot; False when every one is taken."""
        if self.connections >= self.limits.max_connections:
            return False
        self.connections += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        self.connections -= 1
        if self.connections == 0:
            self._idle.set()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A new connection (the listening server's callback), served in a task of ours, which
        :meth:`close_connections` may cancel (asyncio's own callback task must not be)."""
        task = asyncio.create_task(Handler(self, reader, writer).run(), name="wyoming connection")
        self._tasks.add(task)
        try:
            await asyncio.wait([task])
        finally:
            self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("wyoming: a connection failed", exc_info=exc)

    async def close_connections(self, grace: float) -> None:
        """Cancel every connection (their requests with them) and wait for them, at most ``grace`` seconds."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        if self.connections:  # pragma: no cover - a handler stuck past the timeout
            log.warning("wyoming: %d connections still open at shutdown", self.connections)

    async def prepare(self, voice: Union[str, None]) -> Prepared:
        """A request in ``voice`` (None: the default voice) as the sidecar gets it; raises :class:`Refusal`."""
        name = voice if voice is not None else self.default_voice
        if name == DEFAULT_VOICE_NAME and name not in self.sources.mapping:
            name = None
        settings = replace(self.defaults, voice=name)
        return await prepare(
            settings,
            self.backend.facts,
            self.sources,
            max_input=self.limits.max_text_chars,
            max_silence=self.limits.max_silence,
        )

    async def info(self) -> Info:
        listed = await anyio.to_thread.run_sync(self.sources.listing, self.backend.facts)
        named = [(v.name, list(v.languages) or self.languages) for v in listed if v.source != "openai"]
        voices = [
            TtsVoice(
                name=name,
                attribution=_ATTRIBUTION,
                installed=True,
                description=name,
                version=None,
                languages=languages,
            )
            for name, languages in named or [(DEFAULT_VOICE_NAME, self.languages)]
        ]
        program = TtsProgram(
            name="indextts-sidecar",
            attribution=_ATTRIBUTION,
            installed=True,
            description=f"{self.backend.facts.name or 'a TTS engine'} in sidecar processes; text_format: text, ssml",
            version=__version__,
            voices=voices,
            supports_synthesize_streaming=True,
        )
        return Info(tts=[program])


class Handler:
    """One connection: events in under the limits, a speaker task per request, audio out."""

    def __init__(self, service: WyomingService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service, self.reader, self.writer = service, reader, writer
        self._feed: Union[TextFeed, None] = None
        self._speaker: Union[asyncio.Task[None], None] = None
        self._streamed_chars = 0
        #: When an event last came in or went out (audio included).
        self._active = time.monotonic()
        #: An audio-start went out without its audio-stop yet.
        self._audio_open = False

    async def run(self) -> None:
        """Serve the connection until the client leaves, goes idle or breaks the framing."""
        service = self.service
        if not service.enter():
            limit = service.limits.max_connections
            await self._write_quietly(Error(f"too many connections (at most {limit})", code="busy").event())
            self._release_socket()
            return
        try:
            await self._serve()
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("wyoming: connection lost: %s", exc)
        finally:
            try:
                await self.disconnect()
            finally:
                self._release_socket()
                service.leave()

    async def _serve(self) -> None:
        limits = self.service.limits
        while True:
            reading = asyncio.ensure_future(read_event(self.reader, limits.max_event_bytes))
            try:
                while not reading.done():
                    speaker = self._speaker
                    if speaker is not None and not speaker.done():
                        # Audio going out is activity: no idle clock while a request speaks.
                        await asyncio.wait([reading, speaker], return_when=asyncio.FIRST_COMPLETED)
                        continue
                    left = limits.idle_timeout - (time.monotonic() - self._active)
                    if left <= 0:
                        log.info("wyoming: a connection was idle for %g s; closing it", limits.idle_timeout)
                        return
                    await asyncio.wait([reading], timeout=left)
                try:
                    event = reading.result()
                except BadEvent as exc:
                    await self.write_event(Error(exc.message, code=exc.code).event())
                    if exc.fatal:
                        return
                    continue
            finally:
                if not reading.done():
                    reading.cancel()
            if event is None:
                return
            self._active = time.monotonic()
            if not await self.handle_event(event):
                return

    async def write_event(self, event: Event) -> None:
        """Send ``event`` within the write timeout; a client that does not read in time loses its socket."""
        try:
            await asyncio.wait_for(async_write_event(event, self.writer), timeout=self.service.limits.write_timeout)
        except asyncio.TimeoutError:
            log.info("wyoming: a client read nothing for %g s; dropping it", self.service.limits.write_timeout)
            self.writer.transport.abort()
            raise
        self._active = time.monotonic()
        if AudioStart.is_type(event.type):
            self._audio_open = True
        elif AudioStop.is_type(event.type):
            self._audio_open = False

    async def _write_quietly(self, event: Event) -> None:
        if self.writer.transport.is_closing():
            return
        try:
            await self.write_event(event)
        except (OSError, asyncio.TimeoutError):
            pass

    def _release_socket(self) -> None:
        """Close the socket now: aborted when unsent bytes remain (a close would wait to flush them)."""
        transport = self.writer.transport
        if transport.get_write_buffer_size() > 0:
            transport.abort()
        else:
            transport.close()

    async def disconnect(self) -> None:
        """The connection ends: cancel what it asked for; a listener cut mid-audio hears why."""
        speaker, self._speaker = self._speaker, None
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.stop()
        if speaker is not None:
            speaker.cancel()
            await asyncio.wait([speaker])
            if not speaker.cancelled() and (exc := speaker.exception()) is not None:
                log.error("wyoming: a synthesis task failed", exc_info=exc)
        if self._audio_open:
            await self._write_quietly(Error("the server closed the connection mid-audio", code="closed").event())
            await self._write_quietly(AudioStop().event())

    async def handle_event(self, event: Event) -> bool:
        """Answer one event; False closes the connection.  A refusal is an ``error`` event."""
        try:
            if Describe.is_type(event.type):
                await self.write_event((await self.service.info()).event())
            elif SynthesizeStart.is_type(event.type):
                await self._start(event)
            elif SynthesizeChunk.is_type(event.type):
                return await self._chunk(event)
            elif SynthesizeStop.is_type(event.type):
                self._stop()
            elif Synthesize.is_type(event.type):
                if self._feed is None:  # else the streamed request's text again, for servers that do not stream
                    await self._synthesize(event)
            else:
                log.debug("wyoming: ignoring a %r event", event.type)
        except Refusal as refusal:
            await self.write_event(_error(refusal))
        return True

    async def _run_speaker(self, speech: Callable[[], Any]) -> None:
        """Let the request before this one end first (its audio goes out first), then start this one."""
        speaker = self._speaker
        if speaker is not None:
            await asyncio.wait([speaker])
        self._speaker = asyncio.create_task(speech(), name="wyoming speaker")

    # ------------------------------------------------------------ whole text

    async def _synthesize(self, event: Event) -> None:
        text = text_of(event)
        limit = self.service.limits.max_text_chars
        if len(text) > limit:
            raise invalid(f"the text is {len(text)} characters; this server takes at most {limit}", "too_long")
        prepared = replace(await self.service.prepare(voice_of(event)), text_format=text_format_of(event))
        await self._run_speaker(lambda: self._speak_whole(text, prepared))

    async def _speak_whole(self, text: str, prepared: Prepared) -> None:
        """A ``synthesize``: one audio cycle, the chunks sent as they come.  A task of its own,
        so that the connection's reader sees the client leave and cancels it."""
        try:
            async with self.service.backend.stream(text, prepared) as chunks:
                async for chunk in chunks:
                    await self._audio(chunk.sample_rate, chunk.samples.tobytes(), first=not self._audio_open)
            if not self._audio_open:  # no audio at all: an empty cycle (its rate is moot)
                rate = prepared.sample_rate or PCM_RATE
                await self.write_event(AudioStart(rate=rate, width=_WIDTH, channels=1).event())
            await self.write_event(AudioStop().event())
        except SidecarError as exc:
            await self._failed(exc)
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("wyoming: could not send the audio: %s", exc)
            self.writer.transport.abort()

    async def _audio(self, rate: int, pcm: bytes, *, first: bool) -> None:
        if first:
            await self.write_event(AudioStart(rate=rate, width=_WIDTH, channels=_CHANNELS).event())
        await self.write_event(AudioChunk(rate=rate, width=_WIDTH, channels=_CHANNELS, audio=pcm).event())

    async def _failed(self, exc: SidecarError, *, streamed: bool = False) -> None:
        """A failed request: its ``error``, then the end of its audio and of its stream, as the client expects."""
        log.warning("wyoming: synthesis failed: %s", exc)
        await self._write_quietly(_error(refusal_of(exc)))
        if self._audio_open:
            await self._write_quietly(AudioStop().event())
        if streamed:
            await self._write_quietly(SynthesizeStopped().event())

    # ------------------------------------------------------------ streamed text

    async def _start(self, event: Event) -> None:
        if self._feed is not None:
            raise invalid("a streamed synthesis is already open")
        prepared = replace(await self.service.prepare(voice_of(event)), text_format=text_format_of(event))
        feed = self._feed = TextFeed()
        self._streamed_chars = 0
        await self._run_speaker(lambda: self._speak(feed, prepared))

    async def _chunk(self, event: Event) -> bool:
        feed = self._feed
        if feed is None:
            raise invalid("synthesize-chunk before synthesize-start")
        text = text_of(event)
        self._streamed_chars += len(text)
        limit = self.service.limits.max_text_chars
        if self._streamed_chars > limit:
            await self.write_event(Error(f"a streamed text is at most {limit} characters", code="too_long").event())
            return False
        try:
            await feed.send(text)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False  # the speaker is gone (the client stopped reading): close the connection
        return True

    def _stop(self) -> None:
        """The end of the text: the speaker says what is left, then ``synthesize-stopped``.  Not
        awaited: the reader goes on reading, so a client that leaves now still cancels the rest."""
        feed, self._feed = self._feed, None
        if feed is None:
            raise invalid("synthesize-stop before synthesize-start")
        feed.close()

    async def _speak(self, feed: TextFeed, prepared: Prepared) -> None:
        """The audio of a streamed request, one audio-start/chunk/stop cycle per sentence."""
        try:
            stream = self.service.backend.stream_text(feed, prepared)
            async with stream:
                async for item in stream.events():
                    if isinstance(item, SentenceChunk):
                        await self._audio(item.sample_rate, item.samples.tobytes(), first=item.seq == 0)
                    else:
                        await self.write_event(AudioStop().event())
            await self.write_event(SynthesizeStopped().event())
        except SidecarError as exc:
            await self._failed(exc, streamed=True)
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("wyoming: could not send the audio: %s", exc)
            self.writer.transport.abort()
        finally:
            feed.stop()

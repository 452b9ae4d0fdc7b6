"""Pipecat TTS services for IndexTTS: over ``serve``'s WebSocket route, or a Client/Pool in process.

::

    from indextts_client.integrations.pipecat import IndexTTSService

    tts = IndexTTSService(url="ws://127.0.0.1:8000", api_key="KEY", voice="alice")
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(),
                         assistant_aggregator])

Needs the ``pipecat`` extra (``pipecat-ai``; tested with 1.14).  Both services are Pipecat's
own kind of word-timestamp TTS service (they push ``TTSTextFrame`` per word, timed to the audio,
through ``add_word_timestamps``, and leave ``push_text_frames`` off), so that on an interruption
the assistant's context keeps the reply only up to the word the user heard:

- :class:`IndexTTSService` (a ``WebsocketTTSService``): one connection for the whole session,
  one route *context* per turn (Pipecat's turn context id), each sentence flushed as Pipecat
  cuts it (or, in ``TOKEN`` aggregation, the tokens as they come: the route cuts the sentences
  and keeps the next one queued on the sidecar); ``input.done`` at the turn's end; an
  interruption sends ``context.cancel`` (the sidecar stops at once) and keeps the connection.
  The route's ``audio.alignment`` events give the words.  A keep-alive (an empty
  ``session.config``) goes out every ``keepalive_interval`` seconds, within the route's idle
  timeout.  An ``error`` event for a turn's context (an unknown voice, an engine failure)
  becomes Pipecat's ``ErrorFrame`` (pushed upstream) and ends that turn's audio.
- :class:`IndexTTSInProcessService` (a ``TTSService``): the same over a
  :class:`~indextts_client.Client` or :class:`~indextts_client.Pool` the application runs, one
  ``stream_text`` per turn (its sentences on one pool member, the next one queued), the words
  from ``SentenceChunk.words``; an interruption leaves the stream, which cancels it on the sidecar.

docs/agents.md has the walk-through; tests/agents/pipecat/ runs both in Pipecat's own pipeline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Union

import anyio
from pipecat.frames.frames import CancelFrame, EndFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService, WebsocketTTSService
from websockets.protocol import State

from indextts_client import Client, Pool, SentenceChunk, SentenceEnd, TextFeed

from .._socket_events import (
    AudioAlignment,
    AudioStart,
    ContextCancelled,
    ContextDone,
    ServerError,
    ServerEvent,
    SessionReady,
    decode_server_event,
)
from ._socket import Timeline, event, split_frame, stream_url

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_KEEPALIVE_INTERVAL",
    "DEFAULT_STOP_FRAME_TIMEOUT",
    "IndexTTSInProcessService",
    "IndexTTSService",
]

log = logging.getLogger(__name__)

#: Seconds the WebSocket handshake, and then the server's ``session.ready``, may take.
CONNECT_TIMEOUT = 10.0
#: Seconds between keep-alives: well within ``serve``'s ``--ws-idle-timeout`` (60 s by default).
DEFAULT_KEEPALIVE_INTERVAL = 20.0
#: Pipecat ends a turn's audio after this long without any (its ``stop_frame_timeout_s``, 3 s by
#: default).  IndexTTS can take longer than that to a sentence's first audio, and the route and
#: ``stream_text`` say when a turn has ended, so the services wait longer by default.
DEFAULT_STOP_FRAME_TIMEOUT = 30.0
#: Refused or failed turns remembered, so that their later text is not sent (a turn's text comes
#: within the turn; the bound keeps a long session's memory flat).
_FAILED_KEPT = 64


def _text_format(text_format: str) -> str:
    if text_format not in ("text", "ssml"):
        raise ValueError(f"text_format is 'text' or 'ssml', not {text_format!r}")
    return text_format


def _settings(voice: Union[str, None]) -> TTSSettings:
    return TTSSettings(model=None, voice=voice, language=None)


class IndexTTSService(WebsocketTTSService):
    """Pipecat's TTS service over ``indextts-client serve``'s WebSocket route.

    ``url``: the server (``http://host:8000`` or ``ws://host:8000``) or the route's own URL.
    ``api_key``: the server's key (sent as ``Authorization: Bearer``), if it has one.
    ``voice``: a voice the server knows (``serve --voice NAME=clip.wav``); None: its default.
    ``options``: the engine's request options, as on the route's ``session.config``.
    ``sample_rate``: the audio's rate (the route resamples); None: the pipeline's output rate.
    ``text_format``: ``"ssml"`` when the LLM writes SSML (the route cuts it only where no tag or
    element is open: docs/client.md#ssml).
    Other keyword arguments go to Pipecat's ``TTSService`` (``text_aggregation_mode``...).

    Besides Pipecat's own events, ``on_context_cancelled(service, context_id)``: the server has
    confirmed an interrupted turn's ``context.cancel`` (nothing more of it is synthesized).
    """

    _websocket: Any  # Pipecat's WebsocketService sets it: the connection, or None

    def __init__(
        self,
        *,
        url: str = "ws://127.0.0.1:8000",
        api_key: Union[str, None] = None,
        voice: Union[str, None] = None,
        options: Union[dict[str, Any], None] = None,
        sample_rate: Union[int, None] = None,
        keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL,
        text_format: str = "text",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("settings", _settings(voice))
        kwargs.setdefault("stop_frame_timeout_s", DEFAULT_STOP_FRAME_TIMEOUT)
        super().__init__(
            push_text_frames=False,
            push_start_frame=True,
            pause_frame_processing=False,
            sample_rate=sample_rate,
            **kwargs,
        )
        self._url = stream_url(url)
        self._api_key = api_key
        self._options = dict(options) if options else None
        self._text_format = _text_format(text_format)
        self._keepalive_interval = keepalive_interval
        self._receive_task: Any = None
        #: Contexts opened on this connection and not yet ended there, with their audio so far.
        self._timelines: dict[str, Timeline] = {}
        #: Contexts the server refused or failed (the latest): what is still sent for them is not sent.
        self._failed: dict[str, None] = {}
        #: Interrupted contexts whose context.cancel the server has not confirmed yet.
        self._cancelling: set[str] = set()
        self._register_event_handler("on_context_cancelled")

    def can_generate_metrics(self) -> bool:
        return True

    # ------------------------------------------------------------------ connection

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self._connect()

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._disconnect()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._disconnect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))
        self._create_keepalive_task(self._keepalive_interval)

    async def _disconnect(self) -> None:
        await super()._disconnect()
        await self._cancel_keepalive_task()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        try:
            if self._websocket is not None and self._websocket.state is State.OPEN:
                return
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
            self._websocket = await self._websocket_connect(
                self._url, additional_headers=headers, open_timeout=CONNECT_TIMEOUT
            )
            ready = decode_server_event(await asyncio.wait_for(self._websocket.recv(), CONNECT_TIMEOUT))
            if not isinstance(ready, SessionReady):
                raise ConnectionError(f"the server answered {type(ready).__name__}, not session.ready")
            self._timelines.clear()  # contexts do not outlive their connection
            self._failed.clear()
            self._cancelling.clear()
            await self._send_session_config()
            await self._call_event_handler("on_connected")
        except Exception as exc:
            self._websocket = None
            await self.push_error(error_msg=f"{self}: cannot connect to {self._url}: {exc}", exception=exc)
            await self._call_event_handler("on_connection_error", str(exc))

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()
            if self._websocket is not None:
                await self._websocket.close()
        finally:
            self._websocket = None
            self._timelines.clear()
            await self._call_event_handler("on_disconnected")

    async def _send(self, message: str) -> None:
        if self._websocket is None:
            raise ConnectionError(f"{self} is not connected")
        await self._websocket.send(message)

    async def _send_session_config(self) -> None:
        voice = self._settings.voice if isinstance(self._settings.voice, str) else None
        await self._send(
            event(
                "session.config",
                voice=voice,
                response_format="pcm",
                sample_rate=self.sample_rate or None,
                options=self._options,
                text_format=None if self._text_format == "text" else self._text_format,
            )
        )

    async def _send_keepalive(self) -> None:
        # Any client event keeps the route's idle timeout away; this one changes nothing.
        await self._send(event("session.config"))

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        changed: dict[str, Any] = await super()._update_settings(delta)
        if "voice" in changed and self._is_keepalive_ready():
            await self._send_session_config()  # for the contexts (turns) opened from now on
        return changed

    # ------------------------------------------------------------------ sending

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Union[Frame, None], None]:
        """Sends ``text`` to the turn's context (opened by its first text); the audio comes on
        the receive task."""
        if context_id in self._failed:
            yield None
            return
        if self._websocket is None or self._websocket.state is not State.OPEN:
            await self._connect()
        try:
            self._timelines.setdefault(context_id, Timeline(sample_rate=self.sample_rate))
            await self._send(event("input.text", context_id=context_id, text=text))
            if not self._is_streaming_tokens:
                # Pipecat has cut a sentence: speak it now rather than wait for the next one.
                await self._send(event("input.flush", context_id=context_id))
            await self.start_tts_usage_metrics(text)
        except Exception as exc:
            self._timelines.pop(context_id, None)
            await self.push_error(error_msg=f"{self}: cannot send text: {exc}", exception=exc)
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def flush_audio(self, context_id: Union[str, None] = None) -> None:
        """The end of a turn: the route speaks what is left, then ends the context."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id is None or context_id not in self._timelines or not self._is_keepalive_ready():
            return
        await self._send(event("input.done", context_id=context_id))

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: the route cancels the context on the sidecar; the connection stays."""
        await self.stop_all_metrics()
        if self._timelines.pop(context_id, None) is not None and self._is_keepalive_ready():
            self._cancelling.add(context_id)
            await self._send(event("context.cancel", context_id=context_id))
        await super().on_audio_context_interrupted(context_id)

    # ------------------------------------------------------------------ receiving

    async def _receive_messages(self) -> None:
        if self._websocket is None:
            return
        async for message in self._websocket:
            if isinstance(message, bytes):
                await self._on_audio(message)
            elif (event := decode_server_event(message)) is not None:
                await self._on_event(event)

    async def _on_audio(self, message: bytes) -> None:
        context_id, audio = split_frame(message)
        timeline = self._timelines.get(context_id)
        if timeline is None or not audio or not self.audio_context_available(context_id):
            return  # a cancelled turn's last frames
        timeline.add_audio(len(audio))
        frame = TTSAudioRawFrame(audio=audio, sample_rate=self.sample_rate, num_channels=1, context_id=context_id)
        await self.append_to_audio_context(context_id, frame)

    async def _on_event(self, event: ServerEvent) -> None:
        if isinstance(event, ServerError):
            await self._on_error(event)
            return
        if isinstance(event, SessionReady):
            return
        context_id = event.context_id
        if isinstance(event, ContextCancelled):
            if context_id in self._cancelling:
                self._cancelling.discard(context_id)
                await self._call_event_handler("on_context_cancelled", context_id)
            return
        timeline = self._timelines.get(context_id)
        if timeline is None or not self.audio_context_available(context_id):
            return
        match event:
            case AudioStart():
                timeline.start_sentence(event)
            case AudioAlignment():
                words = [(word, start) for word, start, _ in timeline.words(event)]
                if words:
                    await self.add_word_timestamps(words, context_id)
            case ContextDone():
                del self._timelines[context_id]
                await self.stop_ttfb_metrics()
                await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)

    async def _on_error(self, message: ServerError) -> None:
        context_id = message.context_id
        text = f"{self}: {message.code}: {message.message}"
        if not isinstance(context_id, str):
            await self.push_error(error_msg=text)  # the connection's own (its key, its end)
            return
        if context_id not in self._timelines:
            # A turn already ended here: cancelled (a context.cancel that crossed its
            # context.done answers no_such_context), or refused before (its later text and end).
            self._cancelling.discard(context_id)
            log.debug("%s (context %s has ended)", text, context_id)
            return
        del self._timelines[context_id]
        self._failed[context_id] = None
        if len(self._failed) > _FAILED_KEPT:
            del self._failed[next(iter(self._failed))]
        await self.stop_all_metrics()
        await self.push_error(error_msg=text)
        if self._is_keepalive_ready():
            # Text sent before the refusal arrived may have opened the context again (the route
            # opens a context on its first text): closed here, whatever was sent meanwhile.
            await self._send(event("context.cancel", context_id=context_id))
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)


@dataclass
class _Turn:
    feed: TextFeed
    task: Any = None
    words_at: int = 0  # the turn's samples before the current sentence
    samples: int = 0
    sample_rate: int = 0


class IndexTTSInProcessService(TTSService):
    """Pipecat's TTS service over a :class:`~indextts_client.Client` or
    :class:`~indextts_client.Pool` that the application started (and stops).

    One ``stream_text`` per turn; ``voice``, ``sample_rate`` (None: the pipeline's output rate),
    ``text_format`` (``"ssml"`` when the LLM writes SSML) and ``options`` (the engine's, and
    ``stream_text``'s ``lookahead``...) go to it.
    """

    def __init__(
        self,
        client: Union[Client, Pool],
        *,
        voice: Union[str, None] = None,
        sample_rate: Union[int, None] = None,
        options: Union[dict[str, Any], None] = None,
        text_format: str = "text",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("settings", _settings(voice))
        kwargs.setdefault("stop_frame_timeout_s", DEFAULT_STOP_FRAME_TIMEOUT)
        super().__init__(push_text_frames=False, push_start_frame=True, sample_rate=sample_rate, **kwargs)
        self._client = client
        self._options = {**(options or {}), "text_format": _text_format(text_format)}
        self._turns: dict[str, _Turn] = {}

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Union[Frame, None], None]:
        turn = self._turns.get(context_id)
        if turn is None:
            turn = self._turns[context_id] = _Turn(TextFeed())
            turn.task = self.create_task(self._speak(context_id, turn), name=f"indextts-{context_id}")
        try:
            await turn.feed.send(text)
            if not self._is_streaming_tokens:
                await turn.feed.flush()
            await self.start_tts_usage_metrics(text)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the turn's stream has ended (failed): its error is reported there
        yield None

    async def flush_audio(self, context_id: Union[str, None] = None) -> None:
        context_id = context_id or self.get_active_audio_context_id()
        turn = self._turns.get(context_id) if context_id else None
        if turn is not None:
            turn.feed.close()

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        turn = self._turns.pop(context_id, None)
        if turn is not None:
            turn.feed.stop()
            if turn.task is not None:
                await self.cancel_task(turn.task)  # leaves stream_text: cancelled on the sidecar
        await super().on_audio_context_interrupted(context_id)

    async def cleanup(self) -> None:
        for context_id in list(self._turns):
            turn = self._turns.pop(context_id)
            turn.feed.stop()
            if turn.task is not None:
                await self.cancel_task(turn.task)
        await super().cleanup()

    async def _speak(self, context_id: str, turn: _Turn) -> None:
        voice = self._settings.voice if isinstance(self._settings.voice, str) else None
        try:
            async with self._client.stream_text(
                turn.feed, voice=voice, sample_rate=self.sample_rate, **self._options
            ) as stream:
                async for item in stream.events():
                    if self._turns.get(context_id) is not turn:
                        return  # interrupted
                    if isinstance(item, SentenceChunk):
                        await self._on_chunk(context_id, turn, item)
                    elif isinstance(item, SentenceEnd):
                        await self._on_sentence_end(context_id, turn, item)
        except Exception as exc:
            if self._turns.get(context_id) is turn:
                await self.push_error(error_msg=f"{self}: {type(exc).__name__}: {exc}", exception=exc)
        if self._turns.pop(context_id, None) is turn and self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _on_chunk(self, context_id: str, turn: _Turn, chunk: SentenceChunk) -> None:
        turn.sample_rate = chunk.sample_rate
        if chunk.words:  # an engine with word timings: each word before the chunk that starts it
            at = turn.words_at / chunk.sample_rate
            await self.add_word_timestamps([(w.word, at + w.start) for w in chunk.words], context_id)
        turn.samples += len(chunk.samples)
        frame = TTSAudioRawFrame(
            audio=chunk.samples.tobytes(), sample_rate=chunk.sample_rate, num_channels=1, context_id=context_id
        )
        await self.append_to_audio_context(context_id, frame)

    async def _on_sentence_end(self, context_id: str, turn: _Turn, end: SentenceEnd) -> None:
        # An engine without word timings: its segments stand in, known once the sentence ends;
        # each segment's words at its start (Pipecat then holds a segment heard once it began).
        if turn.sample_rate:
            at = turn.words_at / turn.sample_rate
            words = [(part, at + w.start) for w in end.words if w.segment for part in w.word.split()]
            if words:
                await self.add_word_timestamps(words, context_id)
        turn.words_at = turn.samples

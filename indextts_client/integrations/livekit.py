"""A LiveKit Agents text-to-speech over ``indextts-client serve``'s WebSocket route.

    pip install "indextts-sidecar[livekit]"

:class:`TTS` is a ``livekit.agents.tts.TTS`` that streams: an ``AgentSession`` given
``tts=TTS(url=...)`` speaks each reply through one context of the route
(``/v1/audio/speech/stream``), the LLM's text going in as it is written and each sentence's
audio coming back as soon as the server has it.  One WebSocket per :class:`TTS` carries every
stream of it (a context each, named after the stream's request id), so a turn costs no
connection set-up.  It declares ``aligned_transcript``: each sentence's ``audio.alignment``
event becomes LiveKit ``TimedString`` words (their start and end in seconds from the stream's
first sample), which the session's transcript synchronizer paces against playback, so an
interrupted reply is kept in the chat context only up to the word the user heard.

Interrupting (LiveKit closes the stream) sends ``context.cancel`` at once: the sentence being
synthesized and the queued ones stop on the sidecar.  A context the server refuses or that
fails (an ``error`` event) raises :class:`livekit.agents.APIStatusError` with the HTTP status of
its code (``unknown_voice`` and other refusals: 400, not retried; ``busy``: 429, an engine's
failure: 500, and the 503s, retried by LiveKit);
a connection that cannot be made or is lost raises :class:`livekit.agents.APIConnectionError`,
a handshake refused by status (a wrong key: 401) an ``APIStatusError``, and a server silent for
``conn_options.timeout`` once the text is all sent :class:`livekit.agents.APITimeoutError`.

``synthesize(text)`` returns a :class:`ChunkedStream` over the same connection (one context,
its text sent whole).  Audio is 16-bit PCM, mono, at ``sample_rate`` (24 kHz by default; the
server resamples to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import aiohttp
import msgspec
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import TimedString

from .._socket_events import (
    AlignedWord,
    AudioAlignment,
    AudioDone,
    AudioStart,
    ContextCancelled,
    ContextDone,
    ContextEvent,
    MalformedEvent,
    ServerError,
    ServerEvent,
    SessionReady,
    decode_server_event,
)
from ._socket import split_frame, stream_url

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]


# An `error` event's code -> the HTTP status the server's HTTP route answers for it (a code not
# here is a refused request: 400).  LiveKit retries 408, 429 and 5xx; other 4xx are final.
_STATUS = {
    "invalid_api_key": 401,
    "busy": 429,
    "server_error": 500,
    "engine_error": 500,
    "load_failed": 500,
    "internal": 500,
    "shutting_down": 503,
    "starting": 503,
    "overloaded": 503,
    "unavailable": 503,
    "timeout": 504,
}


class _InputDone:
    """The context's text is all sent: from now on the server's silence is bounded."""


# What a context's inbox holds: a JSON event, a binary frame's audio, the failure that ends it,
# or the sender's word that the input is done.
_Item = Union[ServerEvent, bytes, APIError, _InputDone]


class _Flush:
    """A flush of the stream's text, in the order of its pieces."""


def _status_error(event: ServerError, request_id: Union[str, None]) -> APIStatusError:
    code, message = event.code, event.message or "the server refused the request"
    return APIStatusError(
        f"indextts: {message} ({code})",
        status_code=_STATUS.get(code, 400),
        request_id=request_id,
        body=msgspec.to_builtins(event),
    )


def _connection_error(event: ServerError) -> APIError:
    """An ``error`` event without a context: the server is ending the connection."""
    if event.code == "invalid_api_key":
        return _status_error(event, None)
    return APIConnectionError(f"indextts: the server ended the connection: {event.message} ({event.code})")


class _Socket:
    """One WebSocket to the route, its events handed to the context each names."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._inboxes: dict[str, asyncio.Queue[_Item]] = {}
        self._failure: Union[APIError, None] = None
        self._send_lock = asyncio.Lock()
        self._reader = asyncio.create_task(self._read(), name="indextts.livekit.read")

    @classmethod
    async def connect(
        cls, session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], timeout: float
    ) -> _Socket:
        async def handshake() -> tuple[Any, Any]:
            ws = await session.ws_connect(url, headers=dict(headers), autoping=True)
            try:
                return ws, await ws.receive()
            except BaseException:
                await ws.close()
                raise

        try:
            ws, first = await asyncio.wait_for(handshake(), timeout)
        except aiohttp.WSServerHandshakeError as exc:
            raise APIStatusError(
                f"indextts: the WebSocket handshake was refused ({exc.status})", status_code=exc.status
            ) from None
        except (asyncio.TimeoutError, TimeoutError):
            raise APITimeoutError(f"indextts: no session.ready from {url} within {timeout} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise APIConnectionError(f"indextts: cannot connect to {url}") from exc
        event = _decoded(first.data) if first.type is aiohttp.WSMsgType.TEXT else None
        if not isinstance(event, SessionReady):
            await ws.close()
            if isinstance(event, ServerError):
                raise _status_error(event, None)
            raise APIConnectionError(f"indextts: {url} did not answer with session.ready")
        return cls(ws)

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def open(self, context_id: str) -> asyncio.Queue[_Item]:
        inbox: asyncio.Queue[_Item] = asyncio.Queue()
        if self._failure is not None:
            inbox.put_nowait(self._failure)
        self._inboxes[context_id] = inbox
        return inbox

    def forget(self, context_id: str) -> None:
        """No more events for ``context_id`` (a late one, after a cancel, is dropped)."""
        self._inboxes.pop(context_id, None)

    async def send(self, event: Mapping[str, Any]) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            async with self._send_lock:
                await self._ws.send_str(json.dumps(event))
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise APIConnectionError("indextts: the connection was lost") from exc

    def _fail(self, failure: APIError) -> None:
        """The connection is over: every open context gets ``failure``, every new one too."""
        if self._failure is None:
            self._failure = failure
            for inbox in self._inboxes.values():
                inbox.put_nowait(failure)

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                if message.type is aiohttp.WSMsgType.BINARY:
                    try:
                        frame_context, pcm = split_frame(message.data)
                    except ValueError:
                        continue  # not a frame of the route's: no context to give it to
                    inbox = self._inboxes.get(frame_context)
                    if inbox is not None:
                        inbox.put_nowait(pcm)
                elif message.type is aiohttp.WSMsgType.TEXT:
                    try:
                        event = decode_server_event(message.data)
                    except MalformedEvent as exc:  # the context it names fails; any other, none
                        if exc.context_id is not None and (inbox := self._inboxes.get(exc.context_id)) is not None:
                            inbox.put_nowait(APIError(f"indextts: {exc}", retryable=False))
                        continue
                    if isinstance(event, ServerError) and event.context_id is None:
                        # the connection's end (an idle timeout...): the close follows; a stream
                        # starting now must not take this socket
                        self._fail(_connection_error(event))
                    elif isinstance(event, (ServerError, ContextEvent)):
                        inbox = self._inboxes.get(event.context_id or "")
                        if inbox is not None:
                            inbox.put_nowait(event)
        except (aiohttp.ClientError, OSError) as exc:
            self._fail(APIConnectionError(f"indextts: the connection was lost ({type(exc).__name__})"))
        finally:
            self._fail(APIConnectionError(f"indextts: the server closed the connection ({self._ws.close_code})"))

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
        await utils.aio.cancel_and_wait(self._reader)


def _decoded(data: object) -> Union[ServerEvent, None]:
    """A text message's event; None for one that is none (or of a type this client does not know)."""
    try:
        return decode_server_event(data) if isinstance(data, (str, bytes)) else None
    except MalformedEvent:
        return None


def _pieces(text: str, words: list[AlignedWord]) -> list[str]:
    """``text`` cut into one piece per word, adding up to it.

    With the words' character offsets (given and in order): each word with what follows it up to
    the next one.  Without (IndexTTS's segments carry the engine's own text): cut in proportion to
    the words' lengths, at the nearest space where the text has spaces near the cut.
    """
    starts = [w.char_start for w in words if w.char_start is not None]
    if len(starts) == len(words) and starts == sorted(starts) and starts[0] >= 0 and starts[-1] <= len(text):
        return [text[a:b] for a, b in itertools.pairwise([0, *starts[1:], len(text)])]
    lengths = [max(1, len(w.word)) for w in words]
    cuts, done = [0], 0
    for length in lengths[:-1]:
        done += length
        cut = round(len(text) * done / sum(lengths))
        left, right = text.rfind(" ", 0, cut + 1), text.find(" ", cut)
        near = [i for i in (left, right) if i != -1 and abs(i - cut) <= 16]
        if near:
            cut = min(near, key=lambda i: abs(i - cut)) + 1  # the space stays with the piece before
        cuts.append(min(max(cut, cuts[-1]), len(text)))
    cuts.append(len(text))
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def _words(event: AudioAlignment, text: str, *, lead: str, offset: float, duration: float) -> list[TimedString]:
    """A sentence's ``audio.alignment`` as LiveKit words, seconds from the stream's first sample.

    The words' texts add up to ``lead`` and the sentence's text (:func:`_pieces`), so that the
    transcript LiveKit builds from them is the text that was sent.  Without words (an engine
    that gives none), the sentence is one timed piece.  (An event whose words are not objects
    with times in seconds failed to decode: the context got an :class:`APIError`.)
    """
    words = event.words
    if not words:
        return [TimedString(lead + text, start_time=offset, end_time=offset + duration)] if text else []
    out = []
    for i, (word, piece) in enumerate(zip(words, _pieces(text, words), strict=True)):
        start, end = word.start, word.end
        out.append(TimedString((lead if i == 0 else "") + piece, start_time=offset + start, end_time=offset + end))
    return out


class _Link:
    """The TTS's WebSocket, opened on first use and again after it is lost."""

    def __init__(self, url: str, headers: Mapping[str, str], session: Union[aiohttp.ClientSession, None]) -> None:
        self.url, self.headers = url, dict(headers)
        self._session, self._own_session = session, session is None
        self._socket: Union[_Socket, None] = None
        self._lock = asyncio.Lock()

    async def connection(self, timeout: float) -> _Socket:
        async with self._lock:
            if self._socket is None or self._socket.failed:
                if self._socket is not None:
                    await self._socket.aclose()
                    self._socket = None
                if self._session is None:
                    self._session = aiohttp.ClientSession()
                self._socket = await _Socket.connect(self._session, self.url, self.headers, timeout)
            return self._socket

    async def aclose(self) -> None:
        async with self._lock:
            if self._socket is not None:
                await self._socket.aclose()
                self._socket = None
            if self._own_session and self._session is not None:
                await self._session.close()
                self._session = None


@dataclass
class _Options:
    voice: str
    sample_rate: int
    speed: Union[float, None]
    options: dict[str, Any] = field(default_factory=dict)
    text_format: str = "text"

    def settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"voice": self.voice, "response_format": "pcm", "sample_rate": self.sample_rate}
        if self.speed is not None:
            settings["speed"] = self.speed
        if self.text_format != "text":
            settings["text_format"] = self.text_format
        if self.options:
            settings["options"] = self.options
        return settings


class TTS(tts.TTS[Any]):
    """LiveKit's TTS interface over one WebSocket to ``indextts-client serve``.

    ``url``: the server (``http://host:port`` or ``ws://host:port``; the route's path is added
    when the URL names none).  ``api_key``: the server's ``--api-key``, sent as a bearer token.
    ``voice``: a voice the server knows (``serve --voice NAME=REF.wav``, an uploaded one, or the
    engine's own).  ``sample_rate``: of the PCM LiveKit receives.  ``speed`` and ``options`` (the
    engine's request options) as on the route's ``context.config``.  ``http_session``: an
    ``aiohttp.ClientSession`` to use (one of its own, closed by :meth:`aclose`, otherwise).
    ``text_format``: ``"ssml"`` when the LLM writes SSML (cut only where no tag or element is open).
    """

    def __init__(
        self,
        *,
        url: str = "ws://127.0.0.1:8000",
        api_key: Union[str, None] = None,
        voice: str = "alloy",
        sample_rate: int = 24000,
        speed: Union[float, None] = None,
        options: Union[Mapping[str, Any], None] = None,
        http_session: Union[aiohttp.ClientSession, None] = None,
        text_format: str = "text",
    ) -> None:
        if text_format not in ("text", "ssml"):
            raise ValueError(f"text_format is 'text' or 'ssml', not {text_format!r}")
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._link = _Link(stream_url(url), headers, http_session)
        self._opts = _Options(
            voice=voice, sample_rate=sample_rate, speed=speed, options=dict(options or {}), text_format=text_format
        )
        self._prewarm: Union[asyncio.Task[Any], None] = None

    @property
    def model(self) -> str:
        return "indextts"

    @property
    def provider(self) -> str:
        return "indextts-sidecar"

    def update_options(
        self,
        *,
        voice: Union[str, None] = None,
        speed: Union[float, None] = None,
        options: Union[Mapping[str, Any], None] = None,
    ) -> None:
        """Change the voice, speed or engine options of the streams opened from now on."""
        if voice is not None:
            self._opts.voice = voice
        if speed is not None:
            self._opts.speed = speed
        if options is not None:
            self._opts.options = dict(options)

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(
            tts=self, input_text=text, conn_options=conn_options, link=self._link, settings=self._opts.settings()
        )

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options, link=self._link, settings=self._opts.settings())

    def prewarm(self) -> None:
        """Open the WebSocket now, so that the first reply does not wait for it."""

        async def connect() -> None:
            with contextlib.suppress(APIError):
                await self._link.connection(DEFAULT_API_CONNECT_OPTIONS.timeout)

        if self._prewarm is None or self._prewarm.done():
            self._prewarm = asyncio.create_task(connect(), name="indextts.livekit.prewarm")

    async def aclose(self) -> None:
        """Close the WebSocket (and the session of its own)."""
        if self._prewarm is not None:
            await utils.aio.cancel_and_wait(self._prewarm)
        await self._link.aclose()


async def _send_input(
    socket: _Socket,
    context_id: str,
    settings: Mapping[str, Any],
    texts: AsyncIterable[Union[str, _Flush]],
    inbox: asyncio.Queue[_Item],
    on_text: Union[Callable[[], None], None],
) -> None:
    """A context's sending half: its config, each text and flush as it comes, then ``input.done``;
    the inbox hears when the input is done, or the error that stopped it."""
    try:
        await socket.send({"type": "context.config", "context_id": context_id, **settings})
        async for piece in texts:
            if isinstance(piece, _Flush):
                await socket.send({"type": "input.flush", "context_id": context_id})
            elif piece:
                if on_text is not None:
                    on_text()
                await socket.send({"type": "input.text", "context_id": context_id, "text": piece})
        inbox.put_nowait(_InputDone())
        await socket.send({"type": "input.done", "context_id": context_id})
    except APIError as exc:
        inbox.put_nowait(exc)


async def _cancel_context(socket: _Socket, context_id: str, timeout: float) -> None:
    """An interrupted context: stop the sentence being made and the queued ones, without waiting."""
    with contextlib.suppress(APIError, asyncio.TimeoutError, TimeoutError):
        await asyncio.wait_for(socket.send({"type": "context.cancel", "context_id": context_id}), timeout)


async def _speak(
    link: _Link,
    settings: Mapping[str, Any],
    emitter: tts.AudioEmitter,
    texts: AsyncIterable[Union[str, _Flush]],
    *,
    request_id: str,
    streaming: bool,
    timeout: float,
    on_text: Union[Callable[[], None], None] = None,
) -> None:
    """One context: ``texts`` sent as they come, the audio and words pushed to ``emitter``.

    Ends at ``context.done``; an ``error`` event raises; leaving early (LiveKit cancels an
    interrupted stream) cancels the context on the server at once.
    """
    socket = await link.connection(timeout)
    context_id = f"lk-{request_id}"
    inbox = socket.open(context_id)
    input_done = False
    rate = int(settings["sample_rate"])

    sender = asyncio.create_task(
        _send_input(socket, context_id, settings, texts, inbox, on_text), name="indextts.livekit.send"
    )
    ended = False  # the server has ended the context (done or failed): nothing to cancel
    try:
        received = 0  # bytes of audio so far
        sentence_start = 0
        sentence_text = ""
        sentences = 0
        segment = False
        while True:
            try:
                wait = timeout if input_done else None
                item = await asyncio.wait_for(inbox.get(), wait)
            except (asyncio.TimeoutError, TimeoutError):
                raise APITimeoutError(f"indextts: no answer within {timeout} s") from None
            if isinstance(item, _InputDone):
                input_done = True
                continue
            if isinstance(item, APIError):
                ended = isinstance(item, APIConnectionError) or socket.failed
                raise item
            if isinstance(item, bytes):
                emitter.push(item)
                received += len(item)
                continue
            if isinstance(item, AudioStart):
                if streaming and not segment:
                    emitter.start_segment(segment_id=context_id)
                    segment = True
                sentence_start, sentence_text = received, item.text
            elif isinstance(item, AudioAlignment):
                start, length = sentence_start / 2 / rate, (received - sentence_start) / 2 / rate
                lead = " " if sentences else ""
                emitter.push_timed_transcript(_words(item, sentence_text, lead=lead, offset=start, duration=length))
                sentences += 1
            elif isinstance(item, AudioDone):
                if streaming and not (item.flushed and input_done):
                    # more audio may follow, and not soon (the LLM's next sentence): the words
                    # go out now, with the sentence's last audio, not with the next frame
                    emitter.flush()
            elif isinstance(item, (ContextDone, ContextCancelled)):
                ended = True
                if segment:
                    emitter.end_segment()
                return
            elif isinstance(item, ServerError):
                ended = True
                raise _status_error(item, request_id)
    finally:
        socket.forget(context_id)
        await utils.aio.cancel_and_wait(sender)
        if not ended and not socket.failed:
            await _cancel_context(socket, context_id, timeout)


class ChunkedStream(tts.ChunkedStream):
    """``TTS.synthesize(text)``: one context, ``text`` sent whole, its audio and words."""

    def __init__(
        self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions, link: _Link, settings: dict[str, Any]
    ) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._link, self._settings = link, settings

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id,
            sample_rate=self._settings["sample_rate"],
            num_channels=1,
            mime_type="audio/pcm",
        )

        async def text() -> AsyncIterator[str]:
            yield self._input_text

        await _speak(
            self._link,
            self._settings,
            output_emitter,
            text(),
            request_id=request_id,
            streaming=False,
            timeout=self._conn_options.timeout,
        )


class SynthesizeStream(tts.SynthesizeStream):
    """``TTS.stream()``: the text pushed to it, as it comes, into one context of the route."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions, link: _Link, settings: dict[str, Any]) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._link, self._settings = link, settings

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id,
            sample_rate=self._settings["sample_rate"],
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )

        async def texts() -> AsyncIterator[Union[str, _Flush]]:
            async for piece in self._input_ch:
                yield _Flush() if isinstance(piece, self._FlushSentinel) else piece

        await _speak(
            self._link,
            self._settings,
            output_emitter,
            texts(),
            request_id=request_id,
            streaming=True,
            timeout=self._conn_options.timeout,
            on_text=self._mark_started,
        )

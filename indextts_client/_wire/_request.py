"""The request methods, shared by Client and Connection: what each accepts, and the run it starts.

:class:`Requester` is the one copy of the request signatures (``synthesize``, ``stream``,
``ping``...); each method checks and resolves its arguments and hands a run of
:mod:`._request_run` (deadlines, progress, resends, cancel on abandon) the connection
opener of its subclass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import EllipsisType
from typing import Any, Literal, Union

import msgspec

from indextts_sidecar import protocol
from indextts_sidecar.protocol import Emotion, EmotionAudio, EmotionText, EmotionVector

from .._audio import Audio
from .._defaults import DEFAULT_MAX_SILENCE
from .._exceptions import InvalidRequestError
from .._types import Health, LoadInfo, ProgressCallback, SidecarInfo
from ._exchange import Channel
from ._request_run import Call, Synthesis

__all__ = ["EmotionLike", "Requester", "Synthesis", "TimeoutArg", "merge_options"]

#: What ``emotion=`` accepts: a protocol struct, or a dict of the eight named weights
#: (plus optional ``alpha``), or a dict with a ``kind`` of ``vector``/``audio``/``text``.
EmotionLike = Union[EmotionVector, EmotionAudio, EmotionText, Mapping[str, Any], None]
#: ``...`` means "the client's default"; None means "no limit".
TimeoutArg = Union[float, None, EllipsisType]
#: How ``text`` is read: as it is, or as SSML (see docs/client.md#ssml).
TextFormat = Literal["text", "ssml"]
#: Seconds of silence an SSML text's breaks may add up to, by default.
MAX_SILENCE = DEFAULT_MAX_SILENCE

#: The shortest idle deadline for which synthesize() asks the sidecar for no progress: ten
#: times the most by which a quiet request's signs of life may trail its engine's progress.
_QUIET_IDLE_MIN = 10 * protocol.QUIET_PROGRESS_INTERVAL
_Build = Callable[[int], protocol.Request]


def _resolve(value: TimeoutArg, default: Union[float, None]) -> Union[float, None]:
    if value is ...:
        return default
    if value is not None and value < 0:
        raise ValueError(f"a timeout must be >= 0 or None, got {value!r}")
    return value


def _emotion(value: EmotionLike) -> Union[Emotion, None]:
    if value is None or isinstance(value, (EmotionVector, EmotionAudio, EmotionText)):
        return value
    if isinstance(value, Mapping):
        target: Any = Emotion if "kind" in value else EmotionVector
        try:
            result: Emotion = msgspec.convert(dict(value), target)
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(
                f"emotion: {exc}", code="invalid_option", detail={"field": protocol.field_of(exc, "$.emotion")}
            ) from None
        return result
    raise TypeError(
        f"emotion must be an EmotionVector, EmotionAudio, EmotionText or a dict, not {type(value).__name__}"
    )


def merge_options(options: Union[Mapping[str, object], None], keywords: dict[str, Any]) -> dict[str, Any]:
    """The engine's request options: the ``options`` mapping and the keyword arguments together.

    A name given both ways is a :class:`TypeError` (neither silently wins), as is an ``options``
    that is not a mapping of str keys.
    """
    if options is None:
        return keywords
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping, not {type(options).__name__}")
    for name in options:
        if not isinstance(name, str):
            raise TypeError(f"options keys must be str, not {type(name).__name__}")
        if name in keywords:
            raise TypeError(f"option {name!r} given both in options and as a keyword argument")
    return {**options, **keywords}


def _synthesize_builder(
    text: str,
    voice: Union[str, None],
    emotion: EmotionLike,
    sample_rate: Union[int, None],
    options: dict[str, Any],
    progress: bool = True,
    stream: bool = False,
) -> Callable[[int], protocol.Synthesize]:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    if voice is not None and not isinstance(voice, str):
        raise TypeError(f"voice must be a str or None, not {type(voice).__name__}")
    emo = None if emotion is None else _emotion(emotion)

    def build(request_id: int) -> protocol.Synthesize:
        return protocol.Synthesize(
            id=request_id,
            text=text,
            voice=voice,
            emotion=emo,
            sample_rate=sample_rate,
            options=options,
            progress=progress,
            stream=stream,
        )

    return build


class Requester:
    """The request methods shared by :class:`Client` and :class:`Connection`."""

    _default_timeout: Union[float, None] = None
    _default_idle_timeout: Union[float, None] = None
    _default_pool_timeout: Union[float, None] = None

    #: Opens the connection a request is sent on (a Client's restarts the sidecar if it must):
    #: the subclass's method, or for a Client its supervisor's, bound once (no layer per request).
    _connection: Callable[[], Awaitable[Channel]]

    def _sidecar_info(self) -> SidecarInfo:
        """The ``ready`` facts an SSML text is rendered by (Client and Connection have ``info``)."""
        info: SidecarInfo = getattr(self, "info")  # noqa: B009 (the subclasses' property)
        return info

    def _synthesis(
        self,
        keep_audio: bool,
        text: str,
        voice: Union[str, None],
        emotion: EmotionLike,
        sample_rate: Union[int, None],
        on_progress: Union[ProgressCallback, None],
        timeout: TimeoutArg,
        idle_timeout: TimeoutArg,
        options: dict[str, Any],
        assemble_in_reader: bool = False,
        *,
        text_format: TextFormat = "text",
        ssml_strict: bool = True,
        max_silence: float = MAX_SILENCE,
    ) -> Synthesis:
        if text_format != "text":
            return self._ssml(
                keep_audio,
                text,
                voice,
                emotion,
                sample_rate,
                on_progress,
                timeout,
                idle_timeout,
                options,
                ssml_strict,
                max_silence,
                text_format,
                whole=assemble_in_reader,
            )
        idle = _resolve(idle_timeout, self._default_idle_timeout)
        # Nobody looks at this request's progress: ask the sidecar for none, except the signs of
        # life it sends after a quiet spell, which an idle deadline this long still sees in time.
        quiet = assemble_in_reader and on_progress is None and (idle is None or idle >= _QUIET_IDLE_MIN)
        return Synthesis(
            self._connection,
            # stream() and request() hand chunks out as they come: ask for early first audio.
            _synthesize_builder(
                text, voice, emotion, sample_rate, options, progress=not quiet, stream=not assemble_in_reader
            ),
            keep_audio=keep_audio,
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=idle,
            on_progress=on_progress,
            pool_timeout=self._default_pool_timeout,
            assemble_in_reader=assemble_in_reader,
            text=text,
            quiet=quiet,
        )

    def _ssml(
        self,
        keep_audio: bool,
        text: str,
        voice: Union[str, None],
        emotion: EmotionLike,
        sample_rate: Union[int, None],
        on_progress: Union[ProgressCallback, None],
        timeout: TimeoutArg,
        idle_timeout: TimeoutArg,
        options: dict[str, Any],
        strict: bool,
        max_silence: float,
        text_format: str,
        whole: bool = False,
    ) -> Synthesis:
        """An SSML text read and rendered for the engine (refused here if it must be), as a Synthesis
        over one request per segment; ``whole``: synthesize()'s, each segment's audio assembled in the reader."""
        from .._ssml._run import SsmlSynthesis, plan_for

        if text_format != "ssml":
            raise ValueError(f"text_format must be 'text' or 'ssml', not {text_format!r}")
        plan = plan_for(
            self._sidecar_info(),
            text,
            strict=strict,
            max_silence=max_silence,
            voice=voice,
            sample_rate=sample_rate,
            options=options,
        )
        request = {
            "emotion": emotion,
            "sample_rate": sample_rate,
            "on_progress": on_progress,
            "idle_timeout": idle_timeout,
        }
        limit = _resolve(timeout, self._default_timeout)
        return SsmlSynthesis(self, plan, keep_audio=keep_audio, limit=limit, request=request, whole=whole)

    def request(
        self,
        text: str,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
        text_format: TextFormat = "text",
        ssml_strict: bool = True,
        max_silence: float = MAX_SILENCE,
        options: Union[Mapping[str, object], None] = None,
        **keywords: Any,
    ) -> Synthesis:
        """A synthesis whose progress events and audio chunks can be iterated, then its :class:`Audio`.

        ``async with client.request(text) as req: async for event in req.events(): ...``
        then ``audio = await req.result()``.  ``options`` (a mapping) and keyword arguments beyond
        those named are the engine's request options (for ``fake``: ``seconds``, ``delay``...),
        merged; a name given both ways raises :class:`TypeError`.
        """
        return self._synthesis(
            True,
            text,
            voice,
            emotion,
            sample_rate,
            on_progress,
            timeout,
            idle_timeout,
            merge_options(options, keywords),
            text_format=text_format,
            ssml_strict=ssml_strict,
            max_silence=max_silence,
        )

    def stream(
        self,
        text: str,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,
        idle_timeout: TimeoutArg = ...,
        text_format: TextFormat = "text",
        ssml_strict: bool = True,
        max_silence: float = MAX_SILENCE,
        options: Union[Mapping[str, object], None] = None,
        **keywords: Any,
    ) -> Synthesis:
        """Stream the audio: ``async with client.stream(text) as chunks: async for chunk in chunks: ...``.

        Chunks are yielded as they arrive and not kept.  Leaving the ``async with``
        block early cancels the request on the sidecar.
        """
        return self._synthesis(
            False,
            text,
            voice,
            emotion,
            sample_rate,
            on_progress,
            timeout,
            idle_timeout,
            merge_options(options, keywords),
            text_format=text_format,
            ssml_strict=ssml_strict,
            max_silence=max_silence,
        )

    async def synthesize(
        self,
        text: str,
        *,
        voice: Union[str, None] = None,
        emotion: EmotionLike = None,
        sample_rate: Union[int, None] = None,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,  # a request deadline that also cancels it on the sidecar
        idle_timeout: TimeoutArg = ...,
        text_format: TextFormat = "text",
        ssml_strict: bool = True,
        max_silence: float = MAX_SILENCE,
        options: Union[Mapping[str, object], None] = None,
        **keywords: Any,
    ) -> Audio:
        """Speak ``text`` and return the whole :class:`Audio`.

        ``on_progress`` (a function or coroutine function) receives each
        :class:`ProgressEvent` in this task.  ``timeout`` bounds the whole request,
        ``idle_timeout`` the time without a progress or audio frame (``...``: the
        client's default; None: no limit); either raises :class:`RequestTimeoutError`
        after cancelling the request.  ``text_format="ssml"`` reads ``text`` as SSML
        (``ssml_strict``: refuse what the engine cannot honour; ``max_silence``: the
        seconds its breaks may add up to).  ``options`` (a mapping) and other keyword arguments
        are the engine's request options, merged (a name given both ways: :class:`TypeError`).
        """
        synthesis = self._synthesis(
            True,
            text,
            voice,
            emotion,
            sample_rate,
            on_progress,
            timeout,
            idle_timeout,
            merge_options(options, keywords),
            assemble_in_reader=True,
            text_format=text_format,
            ssml_strict=ssml_strict,
            max_silence=max_silence,
        )
        return await synthesis.whole()

    async def _call(
        self,
        build: _Build,
        *,
        timeout: Union[float, None],
        idle_timeout: Union[float, None],
        on_progress: Union[ProgressCallback, None] = None,
        cancellable: bool = True,
    ) -> Call:
        call = Call(
            self._connection,
            build,
            timeout=timeout,
            idle_timeout=idle_timeout,
            on_progress=on_progress,
            cancellable=cancellable,
        )
        await call.run()
        return call

    async def ping(self, *, timeout: TimeoutArg = ...) -> Health:
        """Health check, answered by the sidecar even while it synthesizes.

        Bounded by ``timeout`` and by the client's ``idle_timeout`` (the pong is its only frame).
        """
        call = await self._call(
            lambda i: protocol.Ping(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
            cancellable=False,
        )
        pong = call.reply
        assert isinstance(pong, protocol.Pong)
        return Health(
            round_trip=call.round_trip,
            loaded=pong.loaded,
            queue_depth=pong.queue_depth,
            active=pong.active,
            memory=dict(pong.memory),
            uptime=pong.uptime,
            dropped_options=tuple(pong.dropped_options),
        )

    async def load(
        self,
        *,
        on_progress: Union[ProgressCallback, None] = None,
        timeout: TimeoutArg = ...,  # a request deadline that also cancels it on the sidecar
        idle_timeout: TimeoutArg = ...,
    ) -> LoadInfo:
        """Load the model now (warm-up), reporting progress; returns a :class:`LoadInfo`.

        Raises :class:`LoadFailedError` (retryable) when the model fails to load.
        """
        call = await self._call(
            lambda i: protocol.Load(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=_resolve(idle_timeout, self._default_idle_timeout),
            on_progress=on_progress,
        )
        assert call.reply is not None
        return LoadInfo.from_reply(getattr(call.reply, "info", {}))

    async def unload(self, *, timeout: TimeoutArg = ...) -> None:
        """Drop the model and free its memory (the next request loads it again)."""
        await self._call(
            lambda i: protocol.Unload(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
        )

    async def voices(self, *, timeout: TimeoutArg = ...) -> list[dict[str, Any]]:
        """The engine's named voices, each a map with at least ``name`` (espeak: also
        ``identifier`` and ``languages``).  Answered at once, without loading the model;
        an engine without named voices raises :class:`InvalidRequestError`.
        """
        call = await self._call(
            lambda i: protocol.Voices(id=i),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
            cancellable=False,
        )
        assert isinstance(call.reply, protocol.Ok)
        return [dict(voice) for voice in call.reply.info.get("voices", [])]

    async def register_voice(
        self,
        name: str,
        audio: Union[bytes, bytearray, memoryview],
        *,
        timeout: TimeoutArg = ...,
    ) -> str:
        """Upload a reference clip to the sidecar, stored there under ``name``; returns the voice to use.

        For a sidecar on another machine, where a local path means nothing::

            voice = await client.register_voice("alice", Path("alice.wav").read_bytes())
            audio = await client.synthesize("Hello.", voice=voice)  # voice == "registered:alice"

        The sidecar needs ``--voice-dir`` (it keeps clips there, by content hash, bounded
        by ``--max-voice-bytes`` and ``--max-voices``); registering a name again replaces it.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        data = bytes(audio)
        call = await self._call(
            lambda i: protocol.RegisterVoice(id=i, name=name, audio=data),
            timeout=_resolve(timeout, self._default_timeout),
            idle_timeout=self._default_idle_timeout,
        )
        assert call.reply is not None
        info = dict(getattr(call.reply, "info", {}))
        return str(info.get("voice", protocol.REGISTERED_PREFIX + name))

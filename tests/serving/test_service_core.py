"""The speech-service core (``indextts_client._service``) on its own: no server, no sidecar."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Union

import msgspec
import numpy as np
import pytest

from indextts_client import AudioChunk
from indextts_client._service import (
    MAX_DEPTH,
    EngineFacts,
    Kind,
    Prepared,
    RayBackend,
    Refusal,
    ReplicaInfo,
    ReplicaPing,
    SpeechFields,
    SpeechSettings,
    VoiceSources,
    check_depth,
    depth_of,
    prepare,
    without_paths,
)
from indextts_sidecar.protocol import EmotionVector
from indextts_sidecar.protocol.engine_info import SpeedControl

pytestmark = pytest.mark.anyio

ESPEAK_LIKE = EngineFacts(
    "espeak",
    ("streaming", "voices"),
    SpeedControl(option="rate", normal=175, minimum=80, maximum=450, integer=True),
    EngineFacts.voices_of(
        [
            {"name": "English (Great Britain)", "identifier": "gmw/en", "languages": ["en-gb", "en"]},
            {
                "name": "English (Received Pronunciation)",
                "identifier": "gmw/en-GB-x-rp",
                "languages": ["en-gb-x-rp", "en-gb", "en"],
            },
            {"name": "Chinese (Mandarin)", "identifier": "sit/cmn", "languages": ["cmn", "zh-cmn", "zh"]},
        ]
    ),
)  # fmt: skip


def test_depth_is_counted_outside_strings_and_stops_past_the_limit() -> None:
    assert depth_of(b'{"a": "[[[[", "b": [{"c": "\\"["}]}') == 3
    assert depth_of("[" * 100_000, limit=MAX_DEPTH) == MAX_DEPTH + 1
    check_depth("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    with pytest.raises(Refusal) as refused:
        check_depth("[" * (MAX_DEPTH + 1))
    assert (refused.value.kind, refused.value.code) == (Kind.INVALID, "too_deep")


def test_messages_never_carry_an_absolute_path() -> None:
    text = "cannot open '/srv/voices/.registered-voices/ab cd.wav' or /tmp/x/y.wav (3/4, https://a.b/c)"
    assert without_paths(text) == "cannot open '<path>' or <path> (3/4, https://a.b/c)"
    assert "/srv" not in Refusal(Kind.ENGINE, text).message


def test_engine_voices_are_found_by_name_identifier_and_language_and_spoken_by_identifier() -> None:
    for name, spoken in (
        ("en-gb", "gmw/en"),
        ("EN-GB-X-RP", "gmw/en-GB-x-rp"),
        ("English (Great Britain)", "gmw/en"),
        ("zh", "sit/cmn"),
        ("en-gb+f3", "gmw/en+f3"),
    ):
        assert ESPEAK_LIKE.spoken(name) == spoken, name
    assert ESPEAK_LIKE.spoken("klingon") is None
    assert not ESPEAK_LIKE.clones and EngineFacts("fake").clones


def test_settings_merge_only_what_is_given() -> None:
    session = SpeechSettings(response_format="pcm").merged(msgspec.json.decode(b'{"speed": 1.5}', type=SpeechFields))
    context = session.merged(msgspec.json.decode(b'{"speed": 1.0, "voice": {"id": "v"}}', type=SpeechFields))
    assert (session.speed, context.speed, context.voice, context.response_format) == (1.5, 1.0, "v", "pcm")
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"speed": 9}', type=SpeechFields)


async def test_prepare_resolves_in_one_order_and_refuses_by_field() -> None:
    sources = VoiceSources({"brit": "en-gb"})
    settings = SpeechSettings(voice="brit", speed=2.0, response_format="pcm", options={"pitch": 40})
    prepared = await prepare(settings, ESPEAK_LIKE, sources, max_input=100)
    assert prepared == Prepared(
        voice="gmw/en",
        sample_rate=24000,
        options={"pitch": 40, "rate": 350},
        response_format="pcm",
        voice_source="mapped",
    )
    cases = [
        (SpeechSettings(voice="nobody"), "voice", "unknown_voice"),
        (SpeechSettings(emotion={"happy": 0.5}), "emotion", "unsupported"),
        (SpeechSettings(speed=4.0), "speed", "invalid_request_error"),
        (SpeechSettings(options={"timeout": 1}), "options.timeout", "invalid_request_error"),
        (SpeechSettings(instructions="x" * 101), "instructions", "input_too_long"),
    ]
    for bad, param, code in cases:
        with pytest.raises(Refusal) as refused:
            await prepare(bad, ESPEAK_LIKE, sources, max_input=100)
        assert (refused.value.param, refused.value.code) == (param, code), bad
    fake = EngineFacts("fake", ("emotion_vector",))
    emotional = await prepare(SpeechSettings(emotion={"happy": 0.5}, emotion_strength=0.5), fake, sources, max_input=9)
    assert emotional.emotion == EmotionVector(happy=0.5, alpha=0.5)


class _Served:
    """A stand-in for a RayStream: a ServedStream whose facts are known once it ended."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.facts: dict[str, Any] = {}
        self.words: tuple[Any, ...] = ()
        self.member_index: Union[int, None] = None

    async def __aenter__(self) -> AsyncIterator[AudioChunk]:
        async def chunks() -> AsyncIterator[AudioChunk]:
            yield AudioChunk(samples=np.zeros(4, dtype="<i2"), sample_rate=22050, seq=0, offset_samples=0)

        return chunks()

    async def __aexit__(self, *exc_info: object) -> None:
        self.timings, self.facts = {"total": 0.5}, {"voice_cache": "hit"}


class _Replica:
    """A stand-in for RayClient: what RayBackend needs of it."""

    def __init__(self) -> None:
        self.asked: dict[str, Any] = {}

    async def info(self) -> ReplicaInfo:
        speed = SpeedControl(option="rate", normal=175.0, minimum=80.0, maximum=450.0)
        return ReplicaInfo(engine="espeak", capabilities=("streaming",), sample_rate=22050, speed=speed)

    async def ping(self) -> ReplicaPing:
        return ReplicaPing(
            pid=1, loaded=True, queue_depth=0, memory={}, round_trip=0.001, node_id="n", audio_seconds=0.0
        )

    def stream(self, text: str, **kwargs: Any) -> _Served:
        self.asked = {"text": text, **kwargs}
        return _Served()

    def stream_text(self, texts: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_ray_backend_takes_the_engines_facts_from_the_replica(anyio_backend: str) -> None:
    replica = _Replica()
    backend = RayBackend(replica)
    await backend.start()
    assert backend.facts.speed == SpeedControl(option="rate", normal=175.0, minimum=80.0, maximum=450.0)
    served = backend.stream("hi", Prepared(voice="v", options={"rate": 200}))
    async with served as chunks:
        got = [chunk async for chunk in chunks]
    facts = (served.timings, served.facts, served.member_index)
    assert len(got) == 1 and facts == ({"total": 0.5}, {"voice_cache": "hit"}, None)
    assert replica.asked == {"text": "hi", "voice": "v", "emotion": None, "sample_rate": None, "options": {"rate": 200}}
    health = await backend.health()
    assert health.ok and health.replica["pid"] == 1 and health.replica["node_id"] == "n"

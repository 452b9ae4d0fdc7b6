"""The espeak engine behind a real sidecar: its voices, and unknown ones refused before queueing."""

from __future__ import annotations

import anyio
import pytest

from indextts_client import Client, InvalidRequestError

pytest.importorskip("espeakng_loader")
pytestmark = pytest.mark.anyio


async def test_voices_are_listed_without_loading() -> None:
    with anyio.fail_after(30):
        async with Client("espeak") as client:
            voices = await client.voices()
            assert not (await client.ping()).loaded
    assert len(voices) > 100
    english = [v for v in voices if "en-us" in v["languages"]]
    assert [v["name"] for v in english] == ["English (America)"]
    assert english[0]["identifier"] == "gmw/en-US"


async def test_an_unknown_voice_is_refused_before_the_model_loads() -> None:
    with anyio.fail_after(30):
        async with Client("espeak") as client:
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("Hello", voice="no-such-voice")
            assert caught.value.code == "invalid_input" and caught.value.detail["field"] == "voice"
            # Refused by the engine's check on the event loop, not by synthesis: nothing loaded.
            assert not (await client.ping()).loaded
            assert len(await client.synthesize("Hello", voice="en-us+f3")) > 0


async def test_an_unknown_voice_is_refused_at_once_behind_a_running_request() -> None:
    # About 0.6 s of synthesis left after the first chunk; the refusal and the ping take milliseconds.
    long_text = "This sentence keeps the engine busy for a while. " * 200
    with anyio.fail_after(60):
        async with Client("espeak") as client, client.stream(long_text) as running:
            first = await running.__anext__()  # the long request now runs on the engine
            assert first.seq == 0
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("Hello", voice="no-such-voice")
            assert caught.value.code == "invalid_input" and caught.value.detail["field"] == "voice"
            assert "unknown espeak-ng voice 'no-such-voice'" in caught.value.message
            # Refused before queueing: the long request is still running, nothing queued behind it.
            health = await client.ping()
            assert health.active == running.request_id and health.queue_depth == 0

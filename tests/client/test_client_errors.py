"""What the client refuses before sending, and what it reports: deep options, redacted tracebacks,
a stalled stream; real sidecars.
"""

from __future__ import annotations

import anyio
import pytest
from client_support import expected, fake_client

from indextts_client import BufferFullError, EngineError, InvalidRequestError
from indextts_sidecar import protocol

pytestmark = pytest.mark.anyio


async def test_client_refuses_deep_options_before_sending() -> None:
    def nest(depth: int) -> list[object]:
        value: list[object] = []
        for _ in range(depth - 1):
            value = [value]
        return value

    cycle: list[object] = []
    cycle.append(cycle)
    with anyio.fail_after(20):
        async with fake_client() as client:
            pid = client.pid
            # 980: the reproducer on trio (too deep even to encode, depending on the stack).
            for value in (nest(200), nest(980), nest(100_000), cycle):
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize("hi", nested=value)
                assert caught.value.code == "invalid_option" and caught.value.detail["field"] == "$"
                assert "nested" in caught.value.message
            # 64 levels (the top-level map and options count) are sent and decoded.
            with pytest.raises(InvalidRequestError) as caught:
                await client.synthesize("hi", nested=nest(protocol.MAX_DEPTH - 2))
            assert caught.value.code == "unknown_option" and caught.value.detail["field"] == "$.options.nested"
            assert (await client.synthesize("after")).samples.tobytes() == expected("after")
            assert client.pid == pid and client.restarts == 0


async def test_tracebacks_from_the_sidecar_are_redacted() -> None:
    secret = "hunter2-in-a-traceback"
    token = "hf_" + "a1B2c3D4" * 5
    with anyio.fail_after(20):
        async with fake_client(env={"SERVICE_API_KEY": secret}) as client:
            with pytest.raises(EngineError) as caught:
                await client.synthesize("x", fail_at=0, fail_raw=True, fail_message=f"key={secret} token={token}")
    error = caught.value
    assert error.code == "engine_error"
    traceback = error.detail["traceback"]
    assert "RuntimeError: key=*** token=***" in traceback and "Traceback" in traceback
    for text in (traceback, error.message, str(error)):
        assert secret not in text and token not in text


async def test_a_stalled_stream_consumer_fails_its_own_request_only() -> None:
    with anyio.fail_after(30):
        async with fake_client(max_buffered=1_000_000) as client:
            # 100 s at 8 kHz: 1.6 MB of audio, in 0.5 s chunks of 8 kB.
            async with client.stream("stalled", seconds=100) as stalled:
                # The engine runs one request at a time: this one starts only once the
                # stalled stream was cancelled (or finished).
                other = await client.synthesize("other")
                assert other.samples.tobytes() == expected("other")
                with pytest.raises(BufferFullError) as caught:
                    async for _ in stalled:
                        pass
            error = caught.value
            assert error.limit == 1_000_000 and error.request_id is not None
            assert "max_buffered (1000000)" in error.message and "cancelled" in error.message
            health = await client.ping()
            assert health.active is None and health.queue_depth == 0 and client.restarts == 0

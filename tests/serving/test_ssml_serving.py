"""SSML on the serving front ends through real clients: HTTP with the official ``openai``
package's ``extra_body``, the WebSocket route with ``websockets``, Wyoming with the ``wyoming``
package's ``Synthesize(text_format=SSML)``.  The fake engine's audio is known to the sample, so
each test checks the bytes: the segments' tones with exact silences between them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("defusedxml")

from http_support import KEY, TIMEOUT, Server, server  # noqa: E402

from indextts_sidecar.engines.fake import render  # noqa: E402

SSML = '<speak>ab<break time="125ms"/><sub alias="cd">x</sub></speak>'


def expected(rate: int = 24000) -> bytes:
    silence = np.zeros(round(0.125 * rate), "<i2")
    return np.concatenate([render("ab", rate), silence, render("cd", rate)]).tobytes()


@pytest.fixture(scope="module")
def running() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY) as s:
        yield s


@pytest.fixture
def client(running: Server) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{running.base}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0) as c:
        yield c


def test_http_speaks_ssml(client: Any) -> None:
    answer = client.audio.speech.create(
        model="indextts", voice="alloy", input=SSML, response_format="pcm", extra_body={"text_format": "ssml"}
    )
    assert bytes(answer.content) == expected()


def test_http_plain_text_is_spoken_as_written(client: Any) -> None:
    answer = client.audio.speech.create(model="indextts", voice="alloy", input="<b>", response_format="pcm")
    assert bytes(answer.content) == render("<b>", 24000).tobytes()


@pytest.mark.parametrize(
    ("ssml", "code", "where"),
    [
        ('<speak><phoneme alphabet="ipa" ph="x">a</phoneme></speak>', "unsupported", "line 1, column 8"),
        ("<!DOCTYPE speak [<!ENTITY a 'b'>]><speak>&a;</speak>", "invalid_ssml", "line 1"),
        ('<speak><break time="100000s"/></speak>', "invalid_ssml", "line 1, column 8"),
    ],
    ids=["unsupported", "entity", "a long break"],
)
def test_http_refuses_bad_ssml_with_400(client: Any, ssml: str, code: str, where: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(
            model="indextts", voice="alloy", input=ssml, response_format="pcm", extra_body={"text_format": "ssml"}
        )
    error = caught.value.body
    assert error["code"] == code, error
    assert where in error["message"]


def test_http_refuses_an_unknown_text_format(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(
            model="indextts", voice="alloy", input="a", response_format="pcm", extra_body={"text_format": "html"}
        )
    assert caught.value.body["param"] == "text_format"


# ------------------------------------------------------------------ the WebSocket route, per context


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # websockets' client and uvicorn are asyncio's
async def test_websocket_speaks_ssml_per_context(running: Server, anyio_backend: str) -> None:
    pytest.importorskip("websockets")
    from ws_support import session

    async with session(running) as ws:
        await ws.send("context.config", context_id="ssml", text_format="ssml")
        await ws.send("context.config", context_id="plain")
        for piece in (SSML[:10], SSML[10:30], SSML[30:]):  # a tag split across messages
            await ws.send("input.text", context_id="ssml", text=piece)
        await ws.send("input.text", context_id="plain", text="<b>")
        await ws.send("input.done", context_id="ssml")
        await ws.send("input.done", context_id="plain")
        messages = await ws.until_done("ssml", "plain")
        await ws.send("context.config", context_id="bad", text_format="ssml")
        await ws.send("input.text", context_id="bad", text="<speak><audio/></speak>")
        await ws.send("input.done", context_id="bad")
        refused = await ws.until_done("bad")
    audio = {
        name: b"".join(m[1] for m in messages if isinstance(m, tuple) and m[0] == name) for name in ("ssml", "plain")
    }
    assert audio["ssml"] == expected()
    assert audio["plain"] == render("<b>", 24000).tobytes()
    error = refused[-1]
    assert (error["type"], error["code"], error["context_id"]) == ("error", "unsupported", "bad")
    assert "line 1, column 8" in error["message"]

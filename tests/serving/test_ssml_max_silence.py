"""``--max-silence``: what the breaks of one SSML request may add up to, on real servers started
with ``--max-silence 2``, through real clients (``openai`` with ``extra_body``, ``websockets``,
the ``wyoming`` package's own).  Over the bound: a typed ``invalid_ssml`` naming it (HTTP 400,
an ``error`` event on the WebSocket and Wyoming) before any engine sees the text; within it: the
breaks as exact silences."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("defusedxml")

from http_support import KEY, TIMEOUT, Server, server  # noqa: E402

from indextts_client.http._serve import _parser as serve_parser  # noqa: E402
from indextts_sidecar.engines.fake import render  # noqa: E402

pytestmark = pytest.mark.timeout(120)

#: Over two seconds: one break, and two that only add up to more.
OVER = {
    "one break": '<speak>ab<break time="3s"/>cd</speak>',
    "two breaks": '<speak>ab<break time="1500ms"/>cd<break time="1.5s"/>ef</speak>',
}
WITHIN = '<speak>ab<break time="1s"/>cd</speak>'
BOUND = "breaks add up to more than 2 s of silence"


def within(rate: int = 24000) -> bytes:
    return np.concatenate([render("ab", rate), np.zeros(rate, "<i2"), render("cd", rate)]).tobytes()


@pytest.fixture(scope="module")
def running() -> Iterator[Server]:
    with server("--engine", "fake", "--api-key", KEY, "--max-silence", "2") as s:
        yield s


@pytest.fixture
def client(running: Server) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{running.base}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0) as c:
        yield c


def _speech(client: Any, ssml: str) -> bytes:
    answer = client.audio.speech.create(
        model="indextts", voice="alloy", input=ssml, response_format="pcm", extra_body={"text_format": "ssml"}
    )
    return bytes(answer.content)


@pytest.mark.parametrize("ssml", OVER.values(), ids=OVER.keys())
def test_http_refuses_breaks_over_the_servers_bound(client: Any, ssml: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _speech(client, ssml)
    error = caught.value.body
    assert (error["code"], error["param"]) == ("invalid_ssml", "input"), error
    assert BOUND in error["message"] and "line 1, column" in error["message"], error


def test_http_speaks_breaks_within_the_servers_bound(client: Any) -> None:
    assert _speech(client, WITHIN) == within()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # websockets' client and uvicorn are asyncio's
async def test_websocket_refuses_over_and_speaks_within_the_bound(running: Server, anyio_backend: str) -> None:
    pytest.importorskip("websockets")
    from ws_support import session

    async with session(running) as ws:
        await ws.send("context.config", context_id="over", text_format="ssml")
        await ws.send("input.text", context_id="over", text=OVER["one break"])
        await ws.send("input.done", context_id="over")
        refused = await ws.until_done("over")
        await ws.send("context.config", context_id="ok", text_format="ssml")
        await ws.send("input.text", context_id="ok", text=WITHIN)
        await ws.send("input.done", context_id="ok")
        spoken = await ws.until_done("ok")
    error = refused[-1]
    assert (error["type"], error["code"], error["context_id"]) == ("error", "invalid_ssml", "over"), refused
    assert BOUND in error["message"]
    assert not [m for m in refused if isinstance(m, tuple)]  # no audio before the refusal
    assert spoken[-1] == {"type": "context.done", "context_id": "ok"}
    assert b"".join(m[1] for m in spoken if isinstance(m, tuple)) == within()


# ------------------------------------------------------------------ Wyoming, its command line


@pytest.fixture(scope="module")
def wyoming_address() -> Iterator[tuple[str, int]]:
    pytest.importorskip("wyoming")
    flags = ["--engine", "fake", "--uri", "tcp://127.0.0.1:0", "--max-silence", "2"]
    process = subprocess.Popen(
        [sys.executable, "-m", "indextts_client", "wyoming", *flags],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "listening on tcp://" in line, line
        host, port = line.split("listening on tcp://", 1)[1].strip().rsplit(":", 1)
        yield host, int(port)
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=TIMEOUT)
        assert process.returncode == 0, rest
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_wyoming_refuses_over_and_speaks_within_the_bound(wyoming_address: tuple[str, int]) -> None:
    from wyoming.audio import AudioChunk
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.event import Event
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeTextFormat

    ssml = SynthesizeTextFormat.SSML

    async def until(client: AsyncTcpClient, *last: str) -> list[Event]:
        events = []
        while True:
            event = await client.read_event()
            assert event is not None
            events.append(event)
            if event.type in (*last, "error"):
                return events

    async def talk() -> tuple[list[Event], list[Event], list[Event]]:
        async with AsyncTcpClient(*wyoming_address) as client, asyncio.timeout(TIMEOUT):
            await client.write_event(Synthesize(OVER["two breaks"], text_format=ssml).event())
            whole = await until(client, "audio-stop")
            await client.write_event(SynthesizeStart(text_format=ssml).event())
            await client.write_event(SynthesizeChunk(OVER["one break"]).event())
            await client.write_event(SynthesizeStop().event())
            streamed = await until(client, "synthesize-stopped")
        async with AsyncTcpClient(*wyoming_address) as client, asyncio.timeout(TIMEOUT):
            await client.write_event(Synthesize(WITHIN, text_format=ssml).event())
            spoken = await until(client, "audio-stop")
        return whole, streamed, spoken

    whole, streamed, spoken = asyncio.run(talk())
    for refused in (whole, streamed):
        assert not [e for e in refused if AudioChunk.is_type(e.type)], refused
        error = Error.from_event(refused[-1])
        assert error.code == "invalid_ssml" and BOUND in error.text, error
    assert spoken[-1].type == "audio-stop"
    assert b"".join(AudioChunk.from_event(e).audio for e in spoken if AudioChunk.is_type(e.type)) == within()


# ------------------------------------------------------------------ the flag's own bounds


def _wyoming_parser() -> Any:
    pytest.importorskip("wyoming")
    from indextts_client.wyoming._server import _parser

    return _parser("indextts-client wyoming")


@pytest.mark.parametrize("make", [lambda: serve_parser("serve"), _wyoming_parser], ids=["serve", "wyoming"])
def test_the_flag_is_a_positive_number_of_seconds_at_most_an_hour(
    make: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = make()
    base = ["--uri", "tcp://127.0.0.1:0"] if "wyoming" in parser.prog else []
    assert parser.parse_args(base).max_silence == 60.0
    assert parser.parse_args([*base, "--max-silence", "0.5"]).max_silence == 0.5
    assert parser.parse_args([*base, "--max-silence", "3600"]).max_silence == 3600.0
    for bad in ("0", "-1", "3601", "nan", "inf", "1e400", "ten"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([*base, "--max-silence", bad])
        assert exited.value.code == 2
        message = capsys.readouterr().err
        assert message.count("\n") == 1 and "--max-silence" in message and bad in message, message


def test_the_servers_limits_take_the_same_bounds() -> None:
    from indextts_client.http._limits import Limits as HttpLimits

    limits: list[Any] = [HttpLimits]
    try:
        from indextts_client.wyoming import Limits as WyomingLimits
    except ImportError:  # pragma: no cover - without the wyoming extra
        pass
    else:
        limits.append(WyomingLimits)
    for kind in limits:
        assert kind().max_silence == 60.0 and kind(max_silence=3600).max_silence == 3600
        for bad in (0.0, -1.0, 3600.5, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="max_silence must be in"):
                kind(max_silence=bad)

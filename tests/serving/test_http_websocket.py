"""``/v1/audio/speech/stream`` driven by the ``websockets`` client library against a real
``serve`` process on the fake engine, whose audio is known to the sample
(:func:`render_bytes`).

The tests run on asyncio only: the ``websockets`` client is an asyncio library (its other
client is a blocking one on threads), and the server under test is uvicorn, asyncio too.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from http_support import AUTH, KEY, RATE, Server, assert_duration, server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus
from ws_support import WAIT, Socket, session, url

from indextts_sidecar.engines.fake import render_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

#: Bounds of the shared server, small enough to reach in a test.
MAX_CONTEXTS, MAX_MESSAGE, MAX_PENDING, MAX_CONNECTIONS = 3, 4096, 300, 4


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # websockets' async client is asyncio-only


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    with server(
        "--engine", "fake", "--api-key", KEY,
        "--ws-max-contexts", str(MAX_CONTEXTS),
        "--ws-max-message", str(MAX_MESSAGE),
        "--ws-max-pending-chars", str(MAX_PENDING),
        "--ws-max-connections", str(MAX_CONNECTIONS),
    ) as running:  # fmt: skip
        yield running


def sentences_of(messages: list[Any], context: str) -> list[tuple[str, bytes, dict[str, Any]]]:
    """(text, audio, audio.done) per sentence of ``context``, checking the order of its events."""
    result, current, audio = [], None, b""
    for item in messages:
        if isinstance(item, tuple):
            if item[0] == context:
                assert current is not None, "audio before its audio.start"
                audio += item[1]
            continue
        if item.get("context_id") != context:
            continue
        if item["type"] == "audio.start":
            assert current is None, "audio.start inside a sentence"
            assert item["sentence"] == len(result)
            current, audio = item, b""
        elif item["type"] == "audio.done":
            assert current is not None and item["sentence"] == current["sentence"]
            assert item["bytes"] == len(audio)
            result.append((current["text"], audio, item))
            current = None
    assert current is None, "a sentence without audio.done"
    return result


async def test_fragments_split_mid_word_and_mid_sentence_come_back_as_whole_sentences(srv: Server) -> None:
    async with session(srv) as ws:
        for piece in ("Hel", "lo the", "re. How a", "re y", "ou? And the n", "ext"):
            await ws.send("input.text", context_id="c1", text=piece)
        await ws.send("input.flush", context_id="c1")  # end of a turn without a sentence end
        for piece in (" tu", "rn ", "ends."):
            await ws.send("input.text", context_id="c1", text=piece)
        await ws.send("input.done", context_id="c1")
        messages = await ws.until_done("c1")
    assert messages[-1] == {"type": "context.done", "context_id": "c1"}
    sentences = sentences_of(messages, "c1")
    assert [text for text, _, _ in sentences] == ["Hello there.", "How are you?", "And the next", "turn ends."]
    for text, audio, done in sentences:
        assert audio == render_bytes(text)  # 24 kHz pcm: the fake engine's own samples, every one, in order
        assert done["samples"] == len(audio) // 2
    assert [done["flushed"] for _, _, done in sentences] == [False, False, True, True]
    starts = [m for m in messages if isinstance(m, dict) and m["type"] == "audio.start"]
    assert {(m["response_format"], m["sample_rate"]) for m in starts} == {("pcm", RATE)}


async def test_two_contexts_interleaved_each_get_exactly_their_own_audio(srv: Server) -> None:
    texts = {
        "a": ["One fish. ", "Two fi", "sh. Red ", "fish."],
        "b": ["Blue", " fish swims. ", "Some", "thing else here."],
    }
    async with session(srv) as ws:
        await ws.send("context.config", context_id="b", speed=2.0)  # the fake engine: 0.03 s a character
        for i in range(4):
            for context in ("a", "b"):
                await ws.send("input.text", context_id=context, text=texts[context][i])
        for context in ("a", "b"):
            await ws.send("input.done", context_id=context)
        messages = await ws.until_done("a", "b")
    a, b = sentences_of(messages, "a"), sentences_of(messages, "b")
    assert [t for t, _, _ in a] == ["One fish.", "Two fish.", "Red fish."]
    assert [t for t, _, _ in b] == ["Blue fish swims.", "Something else here."]
    for text, audio, _ in a:
        assert audio == render_bytes(text)
    for text, audio, _ in b:
        assert audio == render_bytes(text, seconds_per_char=0.03)
    frames = [m[0] for m in messages if isinstance(m, tuple)]
    assert set(frames) == {"a", "b"}


async def test_each_context_has_its_own_format(srv: Server) -> None:
    text = "A sentence to encode."
    rounds: list[list[Any]] = []
    async with session(srv) as ws:
        for group in (("mp3", "opus"), ("aac",)):  # at most MAX_CONTEXTS open, wav's included
            for fmt in group:
                await ws.send("context.config", context_id=fmt, response_format=fmt)
            await ws.send("session.config", response_format="wav")  # the default for contexts opened later
            for fmt in (*group, "wav"):
                await ws.send("input.text", context_id=fmt, text=text)
                await ws.send("input.done", context_id=fmt)
            rounds.append(await ws.until_done(*group, "wav"))
    for messages, group in zip(rounds, (("mp3", "opus"), ("aac",)), strict=True):
        for fmt in (*group, "wav"):
            [(said, audio, done)] = sentences_of(messages, fmt)
            assert said == text
            assert done["samples"] == len(render_bytes(text)) // 2
            assert_duration(fmt, audio, done["samples"], RATE)  # PyAV decodes each sentence as a whole file


async def test_cancel_mid_sentence_ends_that_context_within_one_chunk_and_not_the_other(srv: Server) -> None:
    slow = {"chunk_seconds": 0.1, "delay": 0.3}  # a chunk each 0.3 s: 40 chunks of a long sentence
    async with session(srv) as ws:
        await ws.send("context.config", context_id="slow", options=slow)
        await ws.send("input.text", context_id="slow", text="This sentence goes on for a long while. ")
        await ws.send("input.text", context_id="slow", text="And this one is queued behind it.")
        await ws.send("input.done", context_id="slow")
        while not isinstance(item := await ws.next(), tuple):
            pass  # up to the slow context's first audio frame
        assert item[0] == "slow"
        await ws.send("input.text", context_id="other", text="The other context speaks.")
        await ws.send("input.done", context_id="other")
        await ws.send("context.cancel", context_id="slow")
        after = await ws.until_done("slow", "other")
        # The id is free again at once.
        await ws.send("input.text", context_id="slow", text="Again.")
        await ws.send("input.done", context_id="slow")
        again = await ws.until_done("slow")
    slow_frames = [m for m in after if isinstance(m, tuple) and m[0] == "slow"]
    assert len(slow_frames) <= 1  # the frame already on its way, at most
    assert {"type": "context.cancelled", "context_id": "slow"} in after
    assert not any(isinstance(m, dict) and m.get("context_id") == "slow" and m["type"] == "audio.done" for m in after)
    [(text, audio, _)] = sentences_of(after, "other")
    assert (text, audio) == ("The other context speaks.", render_bytes("The other context speaks."))
    [(text, audio, _)] = sentences_of(again, "slow")
    assert audio == render_bytes("Again.")


async def test_the_cancelled_sentences_leave_the_sidecar(srv: Server) -> None:
    async with session(srv) as ws:
        await ws.send("context.config", context_id="h", options={"hang_at": 0})
        await ws.send("input.text", context_id="h", text="Hangs forever. Queued. Also queued.")
        async with httpx.AsyncClient(base_url=srv.base, headers=AUTH, timeout=WAIT) as http:
            for _ in range(100):  # the context's stream holds its member from its first sentence
                if (await http.get("/health")).json()["members"][0]["outstanding"] >= 1:
                    break
            assert (await http.get("/health")).json()["members"][0]["outstanding"] >= 1
            await ws.send("context.cancel", context_id="h")
            assert await ws.until_done("h") == [{"type": "context.cancelled", "context_id": "h"}]
            # The stream's member is released once its sentences are cancelled on the sidecar.
            for _ in range(100):
                if (await http.get("/health")).json()["members"][0]["outstanding"] == 0:
                    break
                await ws.send("session.config")  # a round trip on the socket paces the polling
            assert (await http.get("/health")).json()["members"][0]["outstanding"] == 0


async def test_without_the_key_the_socket_is_refused(srv: Server) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url(srv), additional_headers={"Authorization": "Bearer wrong"}, open_timeout=WAIT):
            pass
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
    # No header: the first event must carry the key (a browser cannot set headers).
    async with session(srv, auth=False) as ws:
        await ws.send("input.text", context_id="x", text="Speak without a key.")
        error = await ws.next()
        with pytest.raises(ConnectionClosed) as closed:
            await ws.next()
    assert isinstance(error, dict) and error["type"] == "error" and error["code"] == "invalid_api_key"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    async with session(srv, auth=False) as ws:
        await ws.send("session.config", api_key="wrong")
        assert (await ws.next())["code"] == "invalid_api_key"  # type: ignore[index]


async def test_the_key_in_the_first_session_config_event(srv: Server) -> None:
    async with session(srv, auth=False) as ws:
        await ws.send("session.config", api_key=KEY, response_format="wav")
        assert await ws.next() == {"type": "session.ready"}
        await ws.send("input.text", text="Keyed by event.")  # context_id defaults to "default"
        await ws.send("input.done")
        messages = await ws.until_done("default")
        await ws.send("context.config", context_id="p", response_format="pcm")  # back to pcm, for this one
        await ws.send("input.text", context_id="p", text="Raw.")
        await ws.send("input.done", context_id="p")
        [(_, raw, _)] = sentences_of(await ws.until_done("p"), "p")
    assert raw == render_bytes("Raw.")
    [(_, audio, done)] = sentences_of(messages, "default")
    assert_duration("wav", audio, len(render_bytes("Keyed by event.")) // 2, RATE)
    assert done["flushed"] is True


async def test_bad_events_are_answered_with_typed_errors_and_the_socket_stays(srv: Server) -> None:
    async with session(srv) as ws:
        await ws.ws.send("not json")
        assert (await ws.next())["code"] == "invalid_event"  # type: ignore[index]
        await ws.ws.send(b"\x00binary")
        assert (await ws.next())["code"] == "invalid_event"  # type: ignore[index]
        await ws.send("input.speak", text="x")
        assert (await ws.next())["code"] == "invalid_event"  # type: ignore[index]
        await ws.send("context.config", context_id="f", response_format="flac")
        error = await ws.next()
        assert isinstance(error, dict) and error["code"] == "unsupported_format" and error["param"] == "response_format"
        await ws.send("input.text", context_id="bad id!", text="x")
        assert (await ws.next())["code"] == "invalid_context_id"  # type: ignore[index]
        await ws.send("input.done", context_id="never")
        assert await ws.next() == {
            "type": "error",
            "code": "no_such_context",
            "message": "no open context 'never'",
            "context_id": "never",
        }
        await ws.send("input.text", context_id="e", text="")
        assert (await ws.next())["code"] == "empty_text"  # type: ignore[index]
        await ws.send("context.config", context_id="v", voice="/etc/passwd")
        assert (await ws.next())["code"] == "unknown_voice"  # type: ignore[index]
        await ws.send("context.config", context_id="o", options={"no_such_option": 1})
        await ws.send("input.text", context_id="o", text="Refused by the engine.")
        await ws.send("input.done", context_id="o")
        error = await ws.next()
        assert isinstance(error, dict) and error["context_id"] == "o" and error["type"] == "error"
        await ws.send("input.text", context_id="ok", text="Still served.")
        await ws.send("input.done", context_id="ok")
        [(_, audio, _)] = sentences_of(await ws.until_done("ok"), "ok")
    assert audio == render_bytes("Still served.")
    assert "Traceback" not in error["message"] and ".py" not in error["message"]  # the class, not the server's insides


async def test_contexts_per_connection_are_bounded(srv: Server) -> None:
    async with session(srv) as ws:
        for i in range(MAX_CONTEXTS):
            await ws.send("context.config", context_id=f"c{i}")
        await ws.send("context.config", context_id="one-more")
        error = await ws.next()
        assert isinstance(error, dict) and (error["code"], error["context_id"]) == ("too_many_contexts", "one-more")
        await ws.send("input.done", context_id="c0")
        assert await ws.until_done("c0") == [{"type": "context.done", "context_id": "c0"}]
        await ws.send("input.text", context_id="one-more", text="Room now.")
        await ws.send("input.done", context_id="one-more")
        [(_, audio, _)] = sentences_of(await ws.until_done("one-more"), "one-more")
    assert audio == render_bytes("Room now.")


async def test_a_message_over_the_size_limit_closes_with_1009(srv: Server) -> None:
    async with session(srv) as ws:
        await ws.send("input.text", context_id="big", text="x" * MAX_MESSAGE)
        _, closed = await ws.drain()
    assert closed.rcvd is not None and closed.rcvd.code == 1009


async def test_text_pending_per_context_is_bounded_and_refused_text_is_said_so(srv: Server) -> None:
    fragment = "Words wait here. "  # 17 characters
    async with session(srv) as ws:
        await ws.send("context.config", context_id="p", options={"hang_at": 0})
        errors = []
        sent = 3 * MAX_PENDING // len(fragment)
        for _ in range(sent):
            await ws.send("input.text", context_id="p", text=fragment)
        await ws.send("context.cancel", context_id="p")
        messages = await ws.until_done("p")
        while messages[-1] != {"type": "context.cancelled", "context_id": "p"}:
            messages += await ws.until_done("p")
        errors = [m for m in messages if isinstance(m, dict) and m["type"] == "error"]
    # The stream took the first sentences (the one hanging, two queued, one in its splitter), then
    # stopped reading; the feed held what the bound allows; the rest was refused, each one said so.
    accepted, held = sent - len(errors), MAX_PENDING // len(fragment)
    assert held < accepted <= held + 6
    assert {(e["code"], e["context_id"]) for e in errors} == {("too_much_pending_text", "p")}


async def test_connections_at_once_are_bounded(srv: Server) -> None:
    async with session(srv) as first:
        async with session(srv), session(srv), session(srv):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(url(srv), additional_headers=AUTH, open_timeout=WAIT):
                    pass
            assert refused.value.response.status_code == 503
            assert json.loads(refused.value.response.body)["error"]["code"] == "overloaded"
        await first.send("session.config")  # the others have left: room again
        async with session(srv) as ws:
            await ws.send("input.text", text="Room again.")
            await ws.send("input.done")
            [(_, audio, _)] = sentences_of(await ws.until_done("default"), "default")
    assert audio == render_bytes("Room again.")


@pytest.fixture(scope="module")
def short() -> Iterator[Server]:
    with server(
        "--engine", "fake", "--api-key", KEY, "--ws-idle-timeout", "2", "--ws-write-timeout", "1",
    ) as running:  # fmt: skip
        yield running


async def test_idle_connection_is_closed_but_audio_counts_as_activity(short: Server) -> None:
    async with session(short) as ws:
        # 3 s of chunks, one each 0.1 s: longer than the idle timeout, never idle for it.
        await ws.send("context.config", context_id="a", options={"chunk_seconds": 0.1, "delay": 0.1})
        text = "Fifty characters of text, no more and no less...."
        await ws.send("input.text", context_id="a", text=text)
        await ws.send("input.done", context_id="a")
        [(_, audio, _)] = sentences_of(await ws.until_done("a"), "a")
        assert audio == render_bytes(text)
        error = await ws.next()
        with pytest.raises(ConnectionClosed) as closed:
            await ws.next()
    assert isinstance(error, dict) and error["code"] == "idle_timeout"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_client_that_does_not_read_is_cut_off_and_its_contexts_cancelled(short: Server) -> None:
    sock = socket.create_connection(short.host_port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # No pings from this client: its own ping timeout would end the connection too.
    options: dict[str, Any] = {"max_queue": 1, "ping_interval": None, "open_timeout": WAIT}
    async with connect(url(short), sock=sock, additional_headers=AUTH, **options) as raw:
        ws = Socket(raw)
        assert await ws.next() == {"type": "session.ready"}
        # 40 s of 48 kHz audio a sentence, 4 MB each, far past what the sockets' buffers hold.
        await ws.send("context.config", context_id="flood", sample_rate=48000, options={"seconds": 40})
        await ws.send("input.text", context_id="flood", text="One. Two. Three. Four.")
        await ws.send("input.done", context_id="flood")
        async with session(short) as other:  # served while the flood waits on its reader
            await other.send("input.text", text="Meanwhile.")
            await other.send("input.done")
            [(_, meanwhile, _)] = sentences_of(await other.until_done("default"), "default")
        assert meanwhile == render_bytes("Meanwhile.")
        short.wait_for("websocket reset: the client read nothing for 1 s")
        async with httpx.AsyncClient(base_url=short.base, headers=AUTH, timeout=WAIT) as http:
            for _ in range(200):
                if (await http.get("/health")).json()["members"][0]["outstanding"] == 0:
                    break
                await http.get("/v1/models")  # a round trip paces the polling
            assert (await http.get("/health")).json()["members"][0]["outstanding"] == 0
        # What was buffered can still be read; then the connection ends without a close frame.
        with anyio.fail_after(WAIT):  # reset by the server, not drained: without the reset, 100 s here
            rest, closed = await ws.drain()
        assert isinstance(closed, ConnectionClosedError) and closed.rcvd is None
        assert not any(isinstance(item, dict) and item["type"] == "context.done" for item in rest)
    async with session(short) as ws:  # the server and its sidecar serve the next client
        await ws.send("input.text", text="Next.")
        await ws.send("input.done")
        [(_, audio, _)] = sentences_of(await ws.until_done("default"), "default")
    assert audio == render_bytes("Next.")


async def test_sigterm_closes_the_sockets_and_stops_their_sidecar_work() -> None:
    import os
    import signal
    import subprocess

    with server("--engine", "fake", "--api-key", KEY, "--grace", "60") as s:
        async with session(s) as ws:
            await ws.send("context.config", context_id="h", options={"hang_at": 0})
            await ws.send("input.text", context_id="h", text="Never spoken. Queued.")
            async with httpx.AsyncClient(base_url=s.base, headers=AUTH, timeout=WAIT) as http:
                members = (await http.get("/health")).json()["members"]
            s.process.send_signal(signal.SIGTERM)
            rest, closed = await ws.drain()
        assert closed.rcvd is not None and closed.rcvd.code == 1012  # uvicorn's "service restart"
        assert not any(isinstance(item, tuple) for item in rest)
        try:
            code = s.process.wait(WAIT)  # a socket left open would hold it for the 60 s grace
        except subprocess.TimeoutExpired:
            pytest.fail("serve did not exit after SIGTERM with a WebSocket open")
        assert code == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(members[0]["pid"], 0)  # the sidecar is gone with it

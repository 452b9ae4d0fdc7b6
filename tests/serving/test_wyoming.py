"""The Wyoming server, driven by the ``wyoming`` package's own client classes.

The wyoming package (server and client) runs on asyncio only, so these tests do too.
The sidecars behind the server are real fake-engine processes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("wyoming")

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient, AsyncTcpClient, AsyncUnixClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from indextts_client import Pool
from indextts_client._service import EngineFacts
from indextts_client.wyoming import Limits, WyomingService, serve
from indextts_sidecar.engines.fake import FakeEngine, render_bytes

pytestmark = pytest.mark.anyio

TIMEOUT = 30
TEXT = "Hello there. How are you today? I am fine, thanks! And you?"
SENTENCES = ["Hello there.", "How are you today?", "I am fine, thanks!", "And you?"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[WyomingService, str, int]]:
    kwargs: dict[str, Any] = getattr(request, "param", {})
    service = WyomingService(
        Pool("fake", ready_timeout=TIMEOUT),
        voices={"alice": None, "bob": None},
        languages=["en"],
        limits=kwargs.pop("limits", Limits()),
        **kwargs,
    )
    address: list[str] = []
    ready = asyncio.Event()

    def on_ready(where: str) -> None:
        address.append(where)
        ready.set()

    task = asyncio.create_task(serve(service, "tcp://127.0.0.1:0", ready=on_ready, handle_signals=False))
    async with asyncio.timeout(TIMEOUT):
        await ready.wait()
    host, port = address[0].removeprefix("tcp://").rsplit(":", 1)
    try:
        yield service, host, int(port)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def read_until(client: AsyncClient, last: str) -> list[Event]:
    events = []
    while True:
        event = await client.read_event()
        assert event is not None, f"the server closed the connection before {last}: {events}"
        events.append(event)
        if event.type in (last, "error"):
            return events


def cycles(events: list[Event]) -> list[bytes]:
    """The audio of each audio-start ... audio-stop cycle, checking the format on the way."""
    out: list[bytes] = []
    current: bytearray | None = None
    for event in events:
        if AudioStart.is_type(event.type):
            start = AudioStart.from_event(event)
            assert (start.rate, start.width, start.channels) == (24000, 2, 1)
            assert current is None
            current = bytearray()
        elif AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            assert (chunk.rate, chunk.width, chunk.channels) == (24000, 2, 1)
            assert current is not None
            current.extend(chunk.audio)
        elif AudioStop.is_type(event.type):
            assert current is not None
            out.append(bytes(current))
            current = None
    assert current is None
    return out


async def test_describe_lists_the_voices_and_streaming(server: tuple[WyomingService, str, int]) -> None:
    _, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(Describe().event())
        events = await read_until(client, "info")
    info = Info.from_event(events[-1])
    (program,) = info.tts
    assert program.supports_synthesize_streaming is True
    assert [(v.name, v.languages) for v in program.voices] == [("alice", ["en"]), ("bob", ["en"])]


async def test_synthesize_returns_the_whole_text_in_one_cycle(server: tuple[WyomingService, str, int]) -> None:
    _, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(Synthesize(TEXT, voice=SynthesizeVoice(name="bob")).event())
        events = await read_until(client, "audio-stop")
    assert cycles(events) == [render_bytes(TEXT)]


@pytest.mark.parametrize("size", [1, 5])
async def test_streamed_text_is_answered_sentence_by_sentence(
    server: tuple[WyomingService, str, int], size: int
) -> None:
    _, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="alice")).event())
        for i in range(0, len(TEXT), size):
            await client.write_event(SynthesizeChunk(TEXT[i : i + size]).event())
        # Home Assistant also sends the whole text, for servers that do not stream: ignored.
        await client.write_event(Synthesize(TEXT).event())
        await client.write_event(SynthesizeStop().event())
        events = await read_until(client, "synthesize-stopped")
        # The connection goes on: a second streamed request on it.
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("Once ").event())
        await client.write_event(SynthesizeChunk("more").event())
        await client.write_event(SynthesizeStop().event())
        again = await read_until(client, "synthesize-stopped")
    assert SynthesizeStopped.is_type(events[-1].type)
    assert cycles(events) == [render_bytes(s) for s in SENTENCES]
    assert cycles(again) == [render_bytes("Once more")]


async def test_the_first_sentence_speaks_before_the_text_ends(server: tuple[WyomingService, str, int]) -> None:
    _, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("First one. Sec").event())
        events = await read_until(client, "audio-stop")
        assert cycles(events) == [render_bytes("First one.")]
        await client.write_event(SynthesizeChunk("ond one.").event())
        await client.write_event(SynthesizeStop().event())
        events = await read_until(client, "synthesize-stopped")
    assert cycles(events) == [render_bytes("Second one.")]


@pytest.mark.parametrize("server", [{"options": {"delay": 1.0}}], indirect=True)
@pytest.mark.parametrize("how", ["streamed, left before stop", "streamed, left after stop", "whole"])
async def test_a_client_that_leaves_mid_sentence_cancels_it_and_the_queued_ones(
    server: tuple[WyomingService, str, int], how: str
) -> None:
    service, host, port = server
    long = "A long first sentence that goes on. Then a second one as long as that. A third, just as long."
    async with asyncio.timeout(TIMEOUT):
        async with AsyncTcpClient(host, port) as client:
            if how == "whole":
                await client.write_event(Synthesize(long).event())
            else:
                await client.write_event(SynthesizeStart().event())
                await client.write_event(SynthesizeChunk(long).event())
                if how.endswith("after stop"):
                    await client.write_event(SynthesizeStop().event())
            while not AudioChunk.is_type((event := await client.read_event()).type):  # type: ignore[union-attr]
                assert event is not None
        # Gone after one chunk of 1 s compute, of sentence 0 (5+ chunks) with sentences 1 and 2
        # queued, or of the whole text (20+ chunks).
        await service.wait_idle()
        audio = await service.pool.synthesize("next")
        (health,) = await service.pool.ping()
    # The engine was free within the one chunk it was computing.
    assert audio.timings["queued"] < 1.0, audio.timings
    assert (health.queue_depth, health.active) == (0, None)
    assert audio.samples.tobytes() == render_bytes("next")


async def test_bad_requests_get_a_typed_error_and_the_connection_goes_on(
    server: tuple[WyomingService, str, int],
) -> None:
    _, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(Synthesize("Hi.", voice=SynthesizeVoice(name="carol")).event())
        (error,) = await read_until(client, "audio-stop")
        assert Error.from_event(error).code == "unknown_voice"
        await client.write_event(SynthesizeChunk("orphan").event())
        (error,) = await read_until(client, "audio-stop")
        assert Error.from_event(error).code == "invalid_event"
        await client.write_event(Synthesize("Still here.").event())
        events = await read_until(client, "audio-stop")
    assert cycles(events) == [render_bytes("Still here.")]


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def raw_event(kind: str, data: bytes) -> bytes:
    """An event whose data part is ``data`` as given (the wyoming client would refuse to encode it)."""
    return b'{"type": "%s", "data_length": %d}\n' % (kind.encode(), len(data)) + data


@pytest.mark.parametrize("server", [{"limits": Limits(max_event_bytes=40_000, max_text_chars=50)}], indirect=True)
async def test_malformed_and_deep_events_get_an_error_and_the_connection_goes_on(
    server: tuple[WyomingService, str, int],
) -> None:
    # Before: json.loads recursed into 30,000 levels (RecursionError: the connection dropped with a
    # traceback), and a line that was not JSON closed the connection.
    _, host, port = server
    bad = [
        (b"not json\n", "invalid_event", "header is not JSON"),
        (b'{"data": {}}\n', "invalid_event", "header has no type"),
        (b'{"type": "synthesize", "data": [1]}\n', "invalid_event", "data is not a JSON object"),
        (b'{"type": "describe", "data": ' + deep(15_000) + b"}\n", "too_deep", "deeper than 64 levels"),
        (raw_event("synthesize", deep(15_000)), "too_deep", "data nests deeper than 64 levels"),
        (raw_event("synthesize", b"{nope"), "invalid_event", "data is not JSON"),
        (raw_event("synthesize", b'{"text": 5}'), "invalid_event", "synthesize event needs a text"),
        (raw_event("synthesize-start", b'{"voice": {"name": 5}}'), "invalid_event", "voice is an object"),
    ]
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        assert client._writer is not None
        for raw, code, words in bad:
            client._writer.write(raw)
            (error,) = await read_until(client, "audio-stop")
            assert (Error.from_event(error).code, words in Error.from_event(error).text) == (code, True), raw[:60]
        await client.write_event(Synthesize("Still here.").event())
        events = await read_until(client, "audio-stop")
    assert cycles(events) == [render_bytes("Still here.")]


@pytest.mark.parametrize("server", [{"limits": Limits(max_event_bytes=1000, max_text_chars=50)}], indirect=True)
async def test_limits_close_a_hostile_connection(server: tuple[WyomingService, str, int]) -> None:
    _, host, port = server
    async with asyncio.timeout(TIMEOUT):
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Event("synthesize", {"text": "x"}, payload=b"\0" * 2000))
            (error,) = await read_until(client, "audio-stop")
            assert Error.from_event(error).code == "too_large"
            assert await client.read_event() is None  # closed: the payload cannot be read past
        async with AsyncTcpClient(host, port) as client:
            assert client._writer is not None
            client._writer.write(b'{"type": "describe", "pad": "' + b"x" * 1500 + b'"}\n')
            (error,) = await read_until(client, "audio-stop")
            assert Error.from_event(error).code == "too_large"
            assert await client.read_event() is None
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Synthesize("y" * 51).event())
            (error,) = await read_until(client, "audio-stop")
            assert Error.from_event(error).code == "too_long"
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk("z" * 30).event())
            await client.write_event(SynthesizeChunk("z" * 30).event())
            events = await read_until(client, "synthesize-stopped")
            assert Error.from_event(events[-1]).code == "too_long"
            assert await client.read_event() is None


@pytest.mark.parametrize("server", [{"limits": Limits(max_connections=1, idle_timeout=0.5)}], indirect=True)
async def test_connection_count_and_silence_are_bounded(server: tuple[WyomingService, str, int]) -> None:
    service, host, port = server
    async with asyncio.timeout(TIMEOUT):
        async with AsyncTcpClient(host, port) as first:
            await first.write_event(Describe().event())
            await read_until(first, "info")
            async with AsyncTcpClient(host, port) as second:
                error = await second.read_event()
                assert error is not None and Error.from_event(error).code == "busy"
                assert await second.read_event() is None
            # Silent past idle_timeout: closed by the server (the test's bound is 60x that).
            assert await first.read_event() is None
        await service.wait_idle()
        assert service.connections == 0


def test_the_command_line_serves_tcp_and_unix_and_stops_on_sigterm(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "carol.wav").write_bytes(b"RIFF stand-in")
    (voices / "notes.txt").write_text("not a voice")
    options = ["--engine", "fake", "--voice", "alice=", "--voice-dir", str(voices), "--language", "en"]
    # The fake engine lists its clips only where it clones (the service offers no clip to an engine that cannot).
    clones = EngineFacts(capabilities=FakeEngine.capabilities).clones
    for uri in ("tcp://127.0.0.1:0", f"unix://{tmp_path / 'w.sock'}"):
        process = subprocess.Popen(
            [sys.executable, "-m", "indextts_client", "wyoming", "--uri", uri, *options],
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.umask(0),  # the socket's mode must not follow the umask
        )
        try:
            assert process.stderr is not None
            line = process.stderr.readline()
            assert "listening on " in line, line
            address = line.split("listening on ", 1)[1].strip()

            async def talk(address: str = address) -> tuple[Info, list[Event]]:
                if address.startswith("tcp://"):
                    host, port = address.removeprefix("tcp://").rsplit(":", 1)
                    client: AsyncClient = AsyncTcpClient(host, int(port))
                else:
                    client = AsyncUnixClient(address.removeprefix("unix://"))
                async with client, asyncio.timeout(TIMEOUT):
                    await client.write_event(Describe().event())
                    info = Info.from_event((await read_until(client, "info"))[-1])
                    voice = SynthesizeVoice(name="carol" if clones else "alice")
                    await client.write_event(Synthesize("Hi.", voice=voice).event())
                    return info, await read_until(client, "audio-stop")

            if uri.startswith("unix://"):
                assert stat.S_IMODE(os.stat(tmp_path / "w.sock").st_mode) == 0o600
            info, events = anyio.run(talk, backend="asyncio")
            assert [(v.name, v.languages) for v in info.tts[0].voices] == [("alice", ["en"])] + (
                [("carol", ["en"])] if clones else []
            )
            assert cycles(events) == [render_bytes("Hi.")]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=TIMEOUT) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()
    assert not os.path.exists(tmp_path / "w.sock")


@pytest.mark.parametrize("server", [{"limits": Limits(idle_timeout=0.5), "options": {"delay": 0.3}}], indirect=True)
async def test_audio_going_out_counts_as_activity_for_the_idle_timeout(
    server: tuple[WyomingService, str, int],
) -> None:
    # 8+ chunks of 0.3 s compute each: the answer takes 5x the idle timeout to arrive.  Before, the
    # silent listener was cut at 0.5 s, mid-audio, without an error or an audio-stop.
    _, host, port = server
    text = "A listener hears a long answer out to the end."
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(Synthesize(text).event())
        events = await read_until(client, "audio-stop")
        assert cycles(events) == [render_bytes(text)]
        assert len([e for e in events if AudioChunk.is_type(e.type)]) >= 5
        # Silent afterwards, with nothing to hear: closed once idle.
        assert await client.read_event() is None


@pytest.mark.parametrize("server", [{"options": {"delay": 0.3}}], indirect=True)
async def test_a_listener_cut_mid_audio_hears_an_error_and_audio_stop(server: tuple[WyomingService, str, int]) -> None:
    service, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(Synthesize("A long answer that the server will not finish.").event())
        await read_until(client, "audio-chunk")
        await service.close_connections(grace=TIMEOUT)  # what a shutdown does
        rest = []
        while (event := await client.read_event()) is not None:
            rest.append(event)
    assert [e.type for e in rest if not AudioChunk.is_type(e.type)] == ["error", "audio-stop"]
    assert Error.from_event(next(e for e in rest if e.type == "error")).code == "closed"


@pytest.mark.parametrize("server", [{"options": {"bogus": 1}}], indirect=True)
async def test_errors_say_what_was_wrong(server: tuple[WyomingService, str, int]) -> None:
    _, host, port = server
    async with AsyncTcpClient(host, port) as client, asyncio.timeout(TIMEOUT):
        await client.write_event(Synthesize("Hi.", voice=SynthesizeVoice(name="carol")).event())
        (error,) = await read_until(client, "audio-stop")
        assert Error.from_event(error).code == "unknown_voice"
        assert "unknown voice 'carol'" in Error.from_event(error).text
        await client.write_event(Synthesize("Hi.").event())
        events = await read_until(client, "audio-stop")
    # The engine's own words about the option it refused, not only "invalid request".
    error = Error.from_event(events[-1])
    assert error.code == "unknown_option" and "bogus" in error.text, error


async def test_describe_lists_the_engines_own_voices_with_their_languages() -> None:
    pytest.importorskip("espeakng_loader")
    # No --voice: before, the voice list was empty (Home Assistant offered no language), and every
    # listed voice claimed en and zh.
    service = WyomingService(Pool("espeak", ready_timeout=TIMEOUT))
    address: list[str] = []
    ready = asyncio.Event()
    task = asyncio.create_task(
        serve(service, "tcp://127.0.0.1:0", ready=lambda a: (address.append(a), ready.set()), handle_signals=False)
    )
    try:
        async with asyncio.timeout(TIMEOUT):
            await ready.wait()
            host, port = address[0].removeprefix("tcp://").rsplit(":", 1)
            async with AsyncTcpClient(host, int(port)) as client:
                await client.write_event(Describe().event())
                info = Info.from_event((await read_until(client, "info"))[-1])
                voices = {v.name: v.languages for v in info.tts[0].voices}
                await client.write_event(Synthesize("Bonjour.", voice=SynthesizeVoice(language="fr-fr")).event())
                events = await read_until(client, "audio-stop")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert voices["French (France)"] == ["fr-fr", "fr"]
    assert len(voices) > 50 and all(languages != ["en", "zh"] for languages in voices.values())
    assert AudioStop.is_type(events[-1].type) and any(AudioChunk.is_type(e.type) for e in events)


def _wyoming(*arguments: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "indextts_client", "wyoming", "--engine", "fake", *arguments],
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_a_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _wyoming("--uri", f"tcp://127.0.0.1:{port}")
        _, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 1
    assert stderr.strip().splitlines() == [
        f"indextts-client wyoming: cannot listen on tcp://127.0.0.1:{port}: Address already in use"
    ], stderr


def test_a_unix_uri_refuses_to_replace_a_file_and_sets_the_mode_asked(tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    process = _wyoming("--uri", f"unix://{precious}")
    _, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 2 and "exists and is not a socket" in stderr and "Traceback" not in stderr
    assert precious.read_text() == "keep me"
    path = tmp_path / "w.sock"
    process = _wyoming("--uri", f"unix://{path}", "--socket-mode", "660", preexec_fn=lambda: os.umask(0o077))
    try:
        assert process.stderr is not None and "listening on " in process.stderr.readline()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        # A second server on the same path is refused: the socket is live.
        second = _wyoming("--uri", f"unix://{path}")
        _, stderr = second.communicate(timeout=TIMEOUT)
        assert second.returncode == 2 and "another server is listening" in stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=TIMEOUT)
        if process.stderr is not None:
            process.stderr.close()
    assert not path.exists()


def _sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts the server's sockets in /proc")
def test_clients_that_stop_reading_lose_their_sockets_on_a_64_descriptor_server() -> None:
    # Before: a write timeout called writer.close(), which keeps the socket until its buffer is
    # flushed: never, for a client that does not read.  At 64 descriptors, nobody was accepted
    # after 56 of them.  Here 8 waves of 10 stalled clients (80 sockets) go through.
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    process = _wyoming(
        "--uri", "tcp://127.0.0.1:0", "--write-timeout", "0.5", "--max-outstanding", "10", preexec_fn=low_limit
    )
    text = "Nobody will hear this long text. " * 150  # 14 MB of audio: more than the socket buffers
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "listening on " in line, line
        host, port = line.split("listening on tcp://", 1)[1].strip().rsplit(":", 1)
        baseline = _sockets(process.pid)

        async def waves() -> Info:
            for _ in range(8):
                clients = [AsyncTcpClient(host, int(port)) for _ in range(10)]
                for client in clients:
                    await client.connect()
                    await client.write_event(Synthesize(text).event())
                # Each is dropped once its write times out: the server holds no socket of theirs.
                with anyio.fail_after(TIMEOUT):
                    for _ in itertools.count():  # polling the server's descriptors, not timing it
                        if _sockets(process.pid) <= baseline:
                            break
                        await asyncio.sleep(0.05)
                for client in clients:
                    await client.disconnect()
            async with AsyncTcpClient(host, int(port)) as client, asyncio.timeout(TIMEOUT):
                await client.write_event(Describe().event())
                return Info.from_event((await read_until(client, "info"))[-1])

        info = anyio.run(waves, backend="asyncio")
        assert info.tts[0].name == "indextts-sidecar"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT) == 0
        if process.stderr is not None:
            process.stderr.close()

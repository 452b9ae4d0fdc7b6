"""``register_voice`` through real sidecars: the shared store's bounds, persistence and sharing on the wire."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import anyio
import pytest
from anyio.abc import ByteReceiveStream
from harness import REPO, sidecar
from voiceclips import clip

from indextts_client import Client, InvalidRequestError, Pool
from indextts_sidecar import protocol
from indextts_sidecar.engines.fake import render_bytes
from indextts_sidecar.voicestore import VoiceStore

pytestmark = pytest.mark.anyio

TIMEOUT = 60
#: The fake engine checks the files a request names (the sidecar's path policy) with this.
VALIDATE = ["--option", "validate=true"]


def _args(voices: Path, *extra: str) -> list[str]:
    return ["--voice-dir", str(voices), *VALIDATE, *extra]


async def test_two_pool_members_on_one_voice_dir_never_evict_each_others_clips(tmp_path: Path) -> None:
    # Issue 23: member 1's register_voice evicted the clip member 0's name "bob" still
    # referred to (names lived in each member's memory); bob's next request failed.
    voices = tmp_path / "voices"
    voices.mkdir()
    alice, bob, carol = (clip(seed=seed) for seed in range(3))
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2, sidecar_args=_args(voices, "--max-voices", "2"), ready_timeout=TIMEOUT) as pool:
            first, second = pool.members
            assert await pool.register_voice("alice", alice) == "registered:alice"
            await first.register_voice("bob", bob)
            # The store holds two clips, both named (one by a name only member 0 registered).
            with pytest.raises(InvalidRequestError, match=r"2 clips, its limit \(--max-voices\), all of them named"):
                await second.register_voice("carol", carol)
            for member in (first, second):  # both members know both names: one store
                for name in ("alice", "bob"):
                    audio = await member.synthesize(f"{name} here", voice=f"registered:{name}")
                    assert audio.samples.tobytes() == render_bytes(f"{name} here")
            # Giving a name a new clip frees its old one: then carol fits.
            await second.register_voice("alice", carol)
            await first.register_voice("carol", carol)
    store = VoiceStore(str(voices / ".registered-voices"))
    assert sorted(i.name for i in store.list()) == ["alice", "bob", "carol"]
    assert {Path(store.path(n)).read_bytes() for n in ("alice", "bob", "carol")} == {bob, carol}


async def test_pool_members_registering_at_once_lose_no_name(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    names = [f"v{i}" for i in range(24)]
    with anyio.fail_after(TIMEOUT):
        async with Pool("fake", size=2, sidecar_args=_args(voices), ready_timeout=TIMEOUT) as pool:
            first, second = pool.members
            async with anyio.create_task_group() as tg:
                for i, name in enumerate(names):
                    tg.start_soon((first if i % 2 else second).register_voice, name, clip(0.01, seed=i))
            for i, name in enumerate(names):
                # Each name works on the member that did not register it.
                audio = await (second if i % 2 else first).synthesize(name, voice=f"registered:{name}")
                assert audio.samples.tobytes() == render_bytes(name)
    assert sorted(i.name for i in VoiceStore(str(voices / ".registered-voices")).list()) == sorted(names)


async def test_a_sidecar_writes_nothing_in_its_voice_dir_until_a_voice_is_registered(tmp_path: Path) -> None:
    # So a read-only --voice-dir of reference clips still starts and serves them.
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "a.wav").write_bytes(clip())
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", sidecar_args=_args(voices), ready_timeout=TIMEOUT) as c:
            audio = await c.synthesize("a path voice", voice=str(voices / "a.wav"))
            assert audio.samples.tobytes() == render_bytes("a path voice")
            with pytest.raises(InvalidRequestError, match="no voice is registered as 'x'"):
                await c.synthesize("x", voice="registered:x")
            assert [p.name for p in voices.iterdir()] == ["a.wav"]
            await c.register_voice("x", clip(seed=1))
            assert sorted(p.name for p in voices.iterdir()) == [".registered-voices", "a.wav"]


async def test_names_are_bounded(tmp_path: Path) -> None:
    # Issue 23: 20,000 names were accepted from one client; now --max-voice-names holds.
    voices = tmp_path / "voices"
    voices.mkdir()
    data = clip()
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", sidecar_args=_args(voices, "--max-voice-names", "3"), ready_timeout=TIMEOUT) as c:
            for name in ("a", "b", "c"):
                await c.register_voice(name, data)
            with pytest.raises(InvalidRequestError) as caught:
                await c.register_voice("d", data)
            assert caught.value.detail["field"] == "$.name"
            assert "3 names, its limit (--max-voice-names)" in caught.value.message
            await c.register_voice("a", clip(seed=9))  # an existing name may get a new clip
            assert len(await c.synthesize("still", voice="registered:a")) > 0


async def test_each_refusal_on_the_wire(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    small = clip(0.1, rate=8000)
    limits = ["--max-voice-bytes", "4000", "--max-voice-total-bytes", "3000", "--max-voice-seconds", "0.2"]
    cases = [
        (b"", "$.audio", "the voice clip is empty"),
        (b"not audio at all", "$.audio", "not audio in a known container"),
        (b"RIFF\x24\x00\x00\x00WAVEjunkjunk", "$.audio", "does not decode as WAV audio"),
        (clip(0.3, rate=8000, fmt="OGG"), "$.audio", "longer than the limit of 0.2 s (--max-voice-seconds)"),
        (clip(0.3, rate=8000), "$.audio", "more than the limit of 4000 (--max-voice-bytes)"),
    ]
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", sidecar_args=_args(voices, *limits), ready_timeout=TIMEOUT) as c:
            for data, field, fragment in cases:
                with pytest.raises(InvalidRequestError) as caught:
                    await c.register_voice("x", data)
                assert caught.value.code == "invalid_input" and caught.value.detail["field"] == field
                assert fragment in caught.value.message, caught.value.message
            await c.register_voice("small", small)
            with pytest.raises(InvalidRequestError, match=r"--max-voice-total-bytes"):
                await c.register_voice("other", clip(0.1, rate=8000, seed=1))
            with pytest.raises(InvalidRequestError, match="no voice is registered as 'x'"):
                await c.synthesize("x", voice="registered:x")
            assert str(voices) not in caught.value.message
    store = VoiceStore(str(voices / ".registered-voices"))
    assert [i.name for i in store.list()] == ["small"]


async def test_names_survive_a_restart_and_ids_name_voices_too(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    data = clip(0.5, rate=16000, fmt="FLAC")
    with anyio.fail_after(TIMEOUT):
        async with Client("fake", sidecar_args=_args(voices), ready_timeout=TIMEOUT) as c:
            assert await c.register_voice("dana", data) == "registered:dana"
        async with Client("fake", sidecar_args=_args(voices), ready_timeout=TIMEOUT) as c:
            audio = await c.synthesize("after a restart", voice="registered:dana")
            assert audio.samples.tobytes() == render_bytes("after a restart")
            info = VoiceStore(str(voices / ".registered-voices")).get("dana")
            assert info.duration_s == 0.5 and info.sample_rate == 16000
            audio = await c.synthesize("by id", voice=f"registered:{info.id}")
            assert audio.samples.tobytes() == render_bytes("by id")


async def test_register_voice_answers_the_clips_facts(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    data = clip(0.25, rate=22050)
    with anyio.fail_after(TIMEOUT):
        async with sidecar("fake", *_args(voices)) as peer:
            await peer.send(protocol.RegisterVoice(id=1, name="eve", audio=data))
            reply = await peer.reply()
    info = VoiceStore(str(voices / ".registered-voices")).get("eve")
    assert isinstance(reply, protocol.Ok) and reply.id == 1
    assert reply.info["duration_s"] == pytest.approx(0.25, abs=1 / 22050)
    assert reply.info == {
        **reply.info,
        "name": "eve",
        "voice": "registered:eve",
        "id": info.id,
        "sha256": info.sha256,
        "bytes": len(data),
        "sample_rate": 22050,
    }


def test_an_unreadable_voice_index_stops_the_sidecar_at_start(tmp_path: Path) -> None:
    store = tmp_path / "voices" / ".registered-voices"
    store.mkdir(parents=True)
    (store / "index.json").write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--voice-dir", str(tmp_path / "voices")],
        capture_output=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    error = protocol.decode_reply(result.stdout[4:])
    assert isinstance(error, protocol.Error) and error.code == "invalid_option"
    assert "index.json is unreadable" in error.message and error.detail == {"field": "--voice-dir"}


@pytest.mark.parametrize(
    "flag", ["--max-voices", "--max-voice-total-bytes", "--max-voice-names", "--max-voice-seconds"]
)
def test_each_bound_must_be_positive(flag: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", flag, "0"],
        capture_output=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2 and f"{flag} must be " in result.stderr.decode()


def test_the_length_bound_must_be_finite() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--max-voice-seconds", "inf"],
        capture_output=True,
        cwd=REPO,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2 and "--max-voice-seconds must be more than 0 and finite" in result.stderr.decode()


_HOLD_LOCK = """
    import fcntl, os, sys
    fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.readline()
"""


def _holds_open(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                return True
        except FileNotFoundError:
            continue
    return False


async def test_a_register_voice_waiting_on_the_store_holds_up_no_other_connection() -> None:
    # register_voice runs in a worker thread: while one waits for the store's lock (held
    # here by another process, as by another pool member mid-write), other connections
    # are served. Before, it ran on the event loop and froze every connection.
    root = Path(tempfile.mkdtemp(prefix="itts-"))
    voices = root / "voices"
    store = voices / ".registered-voices"
    store.mkdir(parents=True)
    command = [sys.executable, "-m", "indextts_sidecar", "--engine", "fake", "--log-level", "WARNING"]
    command += ["--listen", f"unix://{root / 's.sock'}", "--voice-dir", str(voices)]
    hold = [sys.executable, "-c", textwrap.dedent(_HOLD_LOCK), str(store)]
    try:
        with anyio.fail_after(TIMEOUT):
            async with (
                await anyio.open_process(hold) as holder,
                await anyio.open_process(command, stderr=subprocess.DEVNULL) as process,
            ):
                assert holder.stdin is not None and holder.stdout is not None and process.stdout is not None
                assert await _line(holder.stdout) == "locked"
                url = (await _line(process.stdout)).removeprefix("listening on ")
                registered: list[str] = []
                async with Client(url=url) as a, Client(url=url) as b, anyio.create_task_group() as tg:

                    async def register() -> None:
                        registered.append(await a.register_voice("slow", clip()))

                    tg.start_soon(register)
                    # Polling the sidecar's state (it opened the lock file: it waits for it), not a delay.
                    while not _holds_open(process.pid, store / ".lock"):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                    # The store stays locked (10 s before register_voice gives up): b is served now.
                    with anyio.fail_after(5):
                        for _ in range(3):
                            await b.ping()
                        audio = await b.synthesize("meanwhile")
                    assert audio.samples.tobytes() == render_bytes("meanwhile")
                    assert registered == []
                    await holder.stdin.send(b"release\n")
                assert registered == ["registered:slow"]
                process.terminate()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _line(stream: ByteReceiveStream) -> str:
    line = b""
    while not line.endswith(b"\n"):
        line += await stream.receive(1)
    return line.decode().strip()

"""The shared voice store: bounds, names, eviction, invalid audio, persistence, several processes."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from harness import REPO
from voiceclips import clip

from indextts_sidecar import voicestore
from indextts_sidecar.voicestore import (
    INDEX_FILE,
    VoiceConflict,
    VoiceInfo,
    VoiceInvalid,
    VoiceLimits,
    VoiceNotFound,
    VoiceStore,
    VoiceStoreError,
    VoiceStoreFull,
    VoiceTooLarge,
    probe,
)


def clips_in(directory: Path) -> list[str]:
    """The clip files of a store directory (content-hash names), sorted."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith(".") and p.name != INDEX_FILE)


def test_add_get_list_path_delete(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    data = clip(0.5, rate=16000)
    info = store.add("alice", data)
    assert info.name == "alice" and info.bytes == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.sample_rate == 16000 and info.duration_s == pytest.approx(0.5)
    assert info.id.startswith("voice_") and len(info.id) == 30
    assert store.get("alice") == info == store.get(info.id)
    assert store.list() == [info]
    path = Path(store.path(info.id))
    assert path.read_bytes() == data and path.name == info.sha256 + ".wav" and path.parent == tmp_path
    assert store.path("alice") == str(path)
    store.delete(info.id)
    assert store.list() == [] and not path.exists()
    for call in (store.get, store.path, store.delete):
        with pytest.raises(VoiceNotFound) as caught:
            call("alice")
        assert caught.value.status == 404
    with pytest.raises(VoiceNotFound, match="no voice has the id"):
        store.get(info.id)


def test_a_taken_name_is_a_conflict_unless_replaced_and_keeps_its_id(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    first = store.add("alice", clip(seed=1))
    with pytest.raises(VoiceConflict) as caught:
        store.add("alice", clip(seed=2))
    assert caught.value.status == 409 and caught.value.field == "name"
    assert store.get("alice") == first  # the refusal changed nothing
    second = store.add("alice", clip(seed=2), replace=True)
    assert second.id == first.id and second.sha256 != first.sha256
    assert store.list() == [second]
    # The old clip had no other name: it is gone, not left behind.
    assert clips_in(tmp_path) == [second.sha256 + ".wav"]


def test_one_clip_under_two_names_is_stored_once_and_outlives_one_of_them(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    data = clip()
    a = store.add("a", data)
    b = store.add("b", data)
    assert a.id != b.id and store.path("a") == store.path("b")
    assert len(clips_in(tmp_path)) == 1
    store.delete("a")
    assert Path(store.path("b")).read_bytes() == data
    store.delete("b")
    assert clips_in(tmp_path) == []


@pytest.mark.parametrize(
    "name",
    ["", ".hidden", "-x", "a/b", "../escape", "a" * 65, "sp ace", "ünï", "a\0b", "voice_0123456789abcdef01234567"],
)
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    store = VoiceStore(str(tmp_path))
    with pytest.raises(VoiceInvalid) as caught:
        store.add(name, clip())
    assert caught.value.status == 400 and caught.value.field == "name"
    assert store.list() == [] and clips_in(tmp_path) == []


def test_names_up_to_the_rule_are_taken(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    for name in ("a", "A.b_c-9", "x" * 64, "voice_notanid"):
        assert store.add(name, clip()).name == name
    assert [i.name for i in store.list()] == ["a", "A.b_c-9", "x" * 64, "voice_notanid"]


def test_the_clip_size_bound(tmp_path: Path) -> None:
    data = clip()
    store = VoiceStore(str(tmp_path), VoiceLimits(max_clip_bytes=len(data)))
    assert store.add("fits", data).bytes == len(data)
    with pytest.raises(VoiceTooLarge) as caught:
        store.add("big", clip(seed=1) + b"\0")
    assert caught.value.status == 413 and caught.value.field == "audio"
    assert f"limit of {len(data)} (--max-voice-bytes)" in caught.value.message
    assert [i.name for i in store.list()] == ["fits"]


def test_the_clip_length_bound(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path), VoiceLimits(max_clip_seconds=1.0))
    assert store.add("one", clip(1.0, rate=8000)).duration_s == pytest.approx(1.0)
    for fmt in ("WAV", "FLAC", "OGG", "MP3"):
        with pytest.raises(VoiceTooLarge, match=r"longer than the limit of 1 s \(--max-voice-seconds\)"):
            store.add("long", clip(1.5, rate=8000, fmt=fmt))
    assert [i.name for i in store.list()] == ["one"]


def test_the_names_bound(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path), VoiceLimits(max_names=3))
    data = clip()
    for name in ("a", "b", "c"):
        store.add(name, data)
    with pytest.raises(VoiceStoreFull) as caught:
        store.add("d", data)
    assert caught.value.status == 413 and caught.value.field == "name"
    assert "3 names, its limit (--max-voice-names)" in caught.value.message
    # Refused before the clip is decoded: a flood of new names costs no decoding.
    with pytest.raises(VoiceStoreFull):
        store.add("d", b"RIFF not decoded")
    with pytest.raises(VoiceConflict):
        store.add("a", b"RIFF not decoded")
    # Replacing a name adds none: allowed when full.
    store.add("a", clip(seed=5), replace=True)
    store.delete("b")
    store.add("d", data)
    assert sorted(i.name for i in store.list()) == ["a", "c", "d"]


def test_the_clips_bound_removes_only_clips_no_name_refers_to(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path), VoiceLimits(max_clips=2))
    one, two, three = (clip(seed=s) for s in range(3))
    store.add("one", one)
    store.add("two", two)
    with pytest.raises(VoiceStoreFull, match=r"2 clips, its limit \(--max-voices\), all of them named") as caught:
        store.add("three", three)
    assert caught.value.field == "audio"
    assert sorted(Path(store.path(n)).read_bytes() for n in ("one", "two")) == sorted([one, two])
    # A clip left without a name (here: by a writer of an older layout, or by hand) makes room.
    orphan = tmp_path / (hashlib.sha256(b"orphan").hexdigest() + ".wav")
    store.delete("two")
    store.add("two", two)
    assert len(clips_in(tmp_path)) == 2
    store.delete("one")
    orphan.write_bytes(one)
    store.add("three", three)
    assert not orphan.exists()
    assert sorted(i.name for i in store.list()) == ["three", "two"]


def test_a_full_store_takes_a_new_clip_for_a_name_and_a_failed_write_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = VoiceStore(str(tmp_path), VoiceLimits(max_clips=1))
    first = store.add("a", clip(seed=1))
    # The name's old clip is counted as gone: a full store lets the name take a new one.
    assert store.add("a", clip(seed=2), replace=True).sha256 != first.sha256
    assert clips_in(tmp_path) == [store.get("a").sha256 + ".wav"]

    def disk_full(path: str, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(voicestore, "_write_file", disk_full)
    with pytest.raises(VoiceStoreError) as caught:
        store.add("a", clip(seed=3), replace=True)
    assert (
        caught.value.status == 507 and caught.value.message == "the voice store cannot write: No space left on device"
    )
    # The old clip was not removed to make room before the write failed.
    assert Path(store.path("a")).read_bytes() == clip(seed=2)


def test_the_total_bytes_bound(tmp_path: Path) -> None:
    a, b = clip(0.1, seed=1), clip(0.1, seed=2)
    store = VoiceStore(str(tmp_path), VoiceLimits(max_total_bytes=len(a) + len(b)))
    store.add("a", a)
    store.add("b", b)
    with pytest.raises(VoiceStoreFull, match=r"--max-voice-total-bytes") as caught:
        store.add("c", clip(0.01, seed=3))
    assert caught.value.field == "audio"
    # The same clip again takes no room.
    store.add("c", a)
    assert len(clips_in(tmp_path)) == 2


def test_a_clip_that_is_not_audio_is_invalid_and_leaves_nothing(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    good = clip(0.2)
    header_only = clip(0.0)
    cases = {
        "empty": b"",
        "text": b"hello, I am not audio",
        "a playlist": b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n",
        "a truncated header": good[:30],
        "a wav of no samples": header_only,
        "RIFF without data": b"RIFF\x24\x00\x00\x00WAVEjunkjunkjunkjunk",
        "mp3 sync then zeros": b"\xff\xfb\x90\x00" + bytes(2000),
        "flac magic then zeros": b"fLaC" + bytes(200),
        "ogg magic then zeros": b"OggS" + bytes(200),
        "mp4 box then junk": b"\x00\x00\x00\x18ftypM4A " + bytes(200),
        "webm magic then junk": b"\x1a\x45\xdf\xa3" + bytes(200),
        "adts sync then junk": b"\xff\xf1" + bytes(200),
    }
    for what, data in cases.items():
        with pytest.raises(VoiceInvalid) as caught:
            store.add("x", data)
        assert caught.value.status == 400 and caught.value.field == "audio", what
        assert str(tmp_path) not in caught.value.message and "/" not in caught.value.message, what
    assert store.list() == []
    assert list(tmp_path.iterdir()) == []


def test_a_wav_cut_short_is_told_by_the_samples_it_holds_not_its_header(tmp_path: Path) -> None:
    data = clip(0.2)
    half = data[: 44 + (len(data) - 44) // 2]  # the header still promises 0.2 s
    info = VoiceStore(str(tmp_path)).add("half", half)
    assert info.duration_s == pytest.approx(0.1, abs=1 / 24000)


@pytest.mark.parametrize(("fmt", "ext"), [("WAV", ".wav"), ("FLAC", ".flac"), ("OGG", ".ogg"), ("MP3", ".mp3")])
def test_each_container_soundfile_reads(tmp_path: Path, fmt: str, ext: str) -> None:
    store = VoiceStore(str(tmp_path))
    info = store.add("v", clip(1.0, rate=22050, fmt=fmt))
    assert info.sample_rate == 22050
    # Lossy codecs pad: within one codec frame (MP3 1152 samples) of the truth.
    assert info.duration_s == pytest.approx(1.0, abs=1200 / 22050)
    assert store.path("v").endswith(ext)


def _pyav_clip(container: str, codec: str, seconds: float = 1.0, rate: int = 24000) -> bytes:
    av = pytest.importorskip("av")
    import numpy as np

    out = io.BytesIO()
    with av.open(out, "w", format=container) as box:
        stream = box.add_stream(codec, rate=rate, layout="mono")
        samples = (np.random.default_rng(0).uniform(-0.3, 0.3, (1, round(seconds * rate)))).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize(("container", "codec", "ext"), [("mp4", "aac", ".m4a"), ("adts", "aac", ".aac")])
def test_containers_only_pyav_reads(tmp_path: Path, container: str, codec: str, ext: str) -> None:
    store = VoiceStore(str(tmp_path))
    info = store.add("v", _pyav_clip(container, codec))
    assert info.sample_rate == 24000 and info.duration_s == pytest.approx(1.0, abs=2048 / 24000)
    assert store.path("v").endswith(ext)


def test_probe_reports_rate_and_length() -> None:
    audio = probe(clip(0.25, rate=48000, fmt="FLAC"))
    assert (audio.ext, audio.sample_rate, audio.duration_s) == (".flac", 48000, 0.25)


def test_names_and_clips_survive_a_new_store_on_the_directory(tmp_path: Path) -> None:
    first = VoiceStore(str(tmp_path))
    a = first.add("a", clip(seed=1))
    b = first.add("b", clip(seed=2))
    again = VoiceStore(str(tmp_path), VoiceLimits(max_names=2))
    assert again.list() == [a, b]
    assert again.path(a.id) == first.path("a")
    with pytest.raises(VoiceStoreFull):  # the names counted are the ones on disk
        again.add("c", clip(seed=3))
    again.delete("a")
    assert [i.name for i in first.list()] == ["b"]  # and the first store sees the change


def test_an_unreadable_index_fails_at_start_without_a_path(tmp_path: Path) -> None:
    VoiceStore(str(tmp_path)).add("a", clip())
    (tmp_path / INDEX_FILE).write_bytes(b'{"version": 1, "voices": [{"truncated')
    with pytest.raises(VoiceStoreError) as caught:
        VoiceStore(str(tmp_path))
    assert "index.json is unreadable" in caught.value.message and str(tmp_path) not in caught.value.message


def test_an_index_of_another_version_is_not_taken_for_this_one(tmp_path: Path) -> None:
    (tmp_path / INDEX_FILE).write_text('{"version": 2, "voices": []}')
    with pytest.raises(VoiceStoreError, match="has version 2; this version reads 1"):
        VoiceStore(str(tmp_path))


def test_what_the_index_holds(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    info = store.add("a", clip())
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index == {"version": 1, "voices": [{"info": msgspec.to_builtins(info), "file": info.sha256 + ".wav"}]}


def test_the_directory_is_made_by_the_first_change_and_a_blocked_one_is_a_clear_error(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path / "store"))
    assert store.list() == [] and not (tmp_path / "store").exists()
    with pytest.raises(VoiceNotFound):
        store.path("a")
    store.add("a", clip())
    assert (tmp_path / "store").stat().st_mode & 0o777 == 0o700
    # A store that cannot be read (a file in the way): a clear error, without the path, at once.
    (tmp_path / "blocked").write_bytes(b"")
    with pytest.raises(VoiceStoreError) as caught:
        VoiceStore(str(tmp_path / "blocked" / "store"))
    assert caught.value.status == 500 and caught.value.message == "the voice store cannot read: Not a directory"


def test_a_dead_writers_temporary_file_is_swept(tmp_path: Path) -> None:
    store = VoiceStore(str(tmp_path))
    leftover = tmp_path / ".upload-0123456789abcdef"
    leftover.write_bytes(b"half a clip")
    store.add("a", clip())
    assert not leftover.exists()


def test_limits_must_be_positive(tmp_path: Path) -> None:
    for field in ("max_clip_bytes", "max_clips", "max_total_bytes", "max_names", "max_clip_seconds"):
        with pytest.raises(ValueError, match=field):
            VoiceStore(str(tmp_path), VoiceLimits(**{field: 0}))
    with pytest.raises(ValueError, match="max_clip_seconds must be positive and finite"):
        VoiceStore(str(tmp_path), VoiceLimits(max_clip_seconds=float("inf")))


# ------------------------------------------------------------------ several processes


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    """``python -c code args`` with the repository and tests/ importable, its stdio piped."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.path.join(REPO, 'tests')}"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=30)


_WRITER = """
    import sys
    from voiceclips import clip
    from indextts_sidecar.voicestore import VoiceStore
    store = VoiceStore(sys.argv[1])
    tag, count = sys.argv[2], int(sys.argv[3])
    clips = [clip(0.01, seed=hash((tag, i)) % 2**32) for i in range(count)]
    print("ready", flush=True)
    sys.stdin.readline()
    for i, data in enumerate(clips):
        store.add(f"{tag}-{i}", data)
        store.add("shared", data, replace=True)
    print("done", flush=True)
"""


def test_processes_writing_at_once_lose_no_name(tmp_path: Path, children: list[subprocess.Popen[str]]) -> None:
    # Three processes add 40 names each (and keep re-pointing one shared name) at the same time:
    # every read-change-write of the index happens under the lock, so none is lost.
    children.extend(_python(_WRITER, str(tmp_path), tag, "40") for tag in ("a", "b", "c"))
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0 and out == "done\n", err
    store = VoiceStore(str(tmp_path))
    names = {i.name for i in store.list()}
    assert names == {f"{tag}-{i}" for tag in "abc" for i in range(40)} | {"shared"}
    # Every clip on disk is named, and every name's clip is there.
    files = {os.path.basename(store.path(name)) for name in names}
    assert set(clips_in(tmp_path)) == files and len(files) == 120


def test_one_process_never_removes_a_clip_another_process_names(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    limits = VoiceLimits(max_clips=2)
    mine = VoiceStore(str(tmp_path), limits)
    kept = mine.add("kept", clip(seed=1))
    code = """
        import sys
        from voiceclips import clip
        from indextts_sidecar.voicestore import VoiceLimits, VoiceStore, VoiceStoreFull
        store = VoiceStore(sys.argv[1], VoiceLimits(max_clips=2))
        store.add("other", clip(seed=2))
        store.add("other", clip(seed=3), replace=True)  # its old clip goes; "kept" stays
        try:
            store.add("third", clip(seed=4))
        except VoiceStoreFull as exc:
            print("full:", exc.message)
    """
    child = _python(code, str(tmp_path))
    children.append(child)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out == "full: the voice store holds 2 clips, its limit (--max-voices), all of them named\n"
    assert Path(mine.path("kept")).read_bytes() == clip(seed=1)
    assert mine.get("kept") == kept
    assert Path(mine.path("other")).read_bytes() == clip(seed=3)


_HOLD_LOCK = """
    import fcntl, os, sys
    fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_held_lock_bounds_the_wait_and_a_dead_holder_frees_it(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    store = VoiceStore(str(tmp_path), lock_timeout=0.2)
    store.add("a", clip(seed=1))
    holder = _python(_HOLD_LOCK, str(tmp_path))
    children.append(holder)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    with pytest.raises(VoiceStoreError) as caught:
        store.add("b", clip(seed=2))
    assert caught.value.status == 503 and "stayed locked" in caught.value.message
    # Readers do not take the lock.
    assert [i.name for i in store.list()] == ["a"] and os.path.isfile(store.path("a"))
    holder.kill()  # a writer killed while holding the lock: the kernel releases it
    holder.wait(timeout=30)
    assert store.add("b", clip(seed=2)).name == "b"


def test_info_is_a_frozen_struct() -> None:
    info = VoiceInfo(
        id="voice_" + "0" * 24, name="n", sha256="0" * 64, bytes=1, duration_s=1.0, sample_rate=1, created=0
    )
    with pytest.raises(AttributeError):
        info.name = "m"  # type: ignore[misc]


def test_without_soundfile_wav_still_decodes_and_other_formats_say_what_to_install(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    # The core install has no soundfile: WAV falls back to the standard library's wave.
    (tmp_path / "a.wav").write_bytes(clip(0.5, rate=16000))
    (tmp_path / "a.flac").write_bytes(clip(0.5, rate=16000, fmt="FLAC"))
    code = """
        import sys
        sys.modules["soundfile"] = None  # as if not installed: importing it raises ImportError
        sys.modules["av"] = None
        from pathlib import Path
        from indextts_sidecar.voicestore import VoiceStore, VoiceStoreError
        root = Path(sys.argv[1])
        store = VoiceStore(str(root / "store"))
        info = store.add("w", (root / "a.wav").read_bytes())
        print(info.sample_rate, info.duration_s)
        try:
            store.add("f", (root / "a.flac").read_bytes())
        except VoiceStoreError as exc:
            print(exc.status, exc.field, exc.message)
    """
    child = _python(code, str(tmp_path))
    children.append(child)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.splitlines() == ["16000 0.5", "415 audio this server cannot decode FLAC clips: install soundfile or av"]

"""Uploaded reference clips ("voices"), kept in one directory that several processes may share.

One store serves the sidecar's ``register_voice`` and the HTTP server's uploads, with one set
of bounds (:class:`VoiceLimits`).  Layout of the store's directory::

    index.json        every name: its id, its clip, the clip's facts (replaced atomically)
    .lock             taken with flock(2) by whoever changes the index or the clips
    <sha256><.ext>    each distinct clip once, by content hash (the engine reads these)

Readers never lock: the index is only ever replaced whole (written aside, then renamed), so a
reader sees the old index or the new one, and a clip is written before the index names it and
removed after the index stops naming it.  Writers (``add``, ``delete``) hold the lock while
they read the index afresh, change it and write it back, so two processes sharing the directory
(two members of a ``Pool`` given one ``--voice-dir``) never lose each other's names, and a clip
is removed only when no name, of any process, refers to it.

Each clip is decoded on arrival (soundfile for WAV, FLAC, Ogg, MP3, AIFF; PyAV, when it is
installed, for MP4/M4A, AAC and WebM), so what is stored is audio some decoder reads.  The
decoders are imported on the first ``add``; this module needs the core dependencies only.

The methods block (file I/O, decoding): async callers run them in a worker thread.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Union

import msgspec

__all__ = [
    "INDEX_FILE",
    "SIDECAR_SUBDIR",
    "VoiceConflict",
    "VoiceInfo",
    "VoiceInvalid",
    "VoiceLimits",
    "VoiceNotFound",
    "VoiceStore",
    "VoiceStoreError",
    "VoiceStoreFull",
    "VoiceTooLarge",
]

INDEX_FILE = "index.json"
#: Where a sidecar keeps its store: this subdirectory of its first ``--voice-dir``.  A server
#: that shares the sidecars' store (``serve --voice-dir DIR``) opens ``DIR/SIDECAR_SUBDIR``.
SIDECAR_SUBDIR = ".registered-voices"
_LOCK_FILE = ".lock"
_TEMP_PREFIX = ".upload-"
#: A voice's name: what ``registered:NAME`` and the HTTP ``name`` field carry.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ID = re.compile(r"voice_[0-9a-f]{24}")
_CLIP = re.compile(r"[0-9a-f]{64}\.[a-z0-9]{1,5}")
_MIN_RATE, _MAX_RATE = 1000, 384_000
_MAX_CHANNELS = 8


class VoiceLimits(msgspec.Struct, frozen=True):
    """The store's bounds.  Each is a flag of the sidecar and of ``indextts-client serve``."""

    #: Largest clip, in bytes (``--max-voice-bytes``).
    max_clip_bytes: int = 10 * 2**20
    #: Distinct clips stored (``--max-voices``).
    max_clips: int = 256
    #: All clips together, in bytes (``--max-voice-total-bytes``).
    max_total_bytes: int = 512 * 2**20
    #: Names, each referring to one clip (``--max-voice-names``).
    max_names: int = 1024
    #: Longest clip, in seconds of audio (``--max-voice-seconds``); also bounds the time spent decoding.
    max_clip_seconds: float = 300.0


class VoiceInfo(msgspec.Struct, frozen=True):
    """One stored voice: a name and the clip it refers to."""

    #: ``voice_`` and 24 hex digits; kept when the name is given a new clip.
    id: str
    name: str
    #: Of the clip's bytes as uploaded.
    sha256: str
    bytes: int
    duration_s: float
    sample_rate: int
    #: When the name was given its current clip (seconds since the epoch).
    created: float


class _Entry(msgspec.Struct, frozen=True):
    """A name in ``index.json``: its public facts and the clip's file name."""

    info: VoiceInfo
    file: str


_INDEX_VERSION = 1


class _Index(msgspec.Struct):
    #: Changed only with a layout an older reader must not take for its own.
    version: int = _INDEX_VERSION
    voices: list[_Entry] = msgspec.field(default_factory=list)


class VoiceStoreError(Exception):
    """A refused store operation.  ``status`` is the HTTP status that fits; ``field`` the input at fault.

    ``field`` is ``"name"`` or ``"audio"`` (or None); each transport spells it its own way
    (``$.name`` on the wire, the form field over HTTP).  ``message`` never holds a path.
    """

    status: int = 500

    def __init__(self, message: str, *, field: Union[str, None] = None, status: Union[int, None] = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if status is not None:
            self.status = status


class VoiceInvalid(VoiceStoreError):
    """An empty clip, one that does not decode as audio, or a bad name."""

    status = 400


class VoiceTooLarge(VoiceStoreError):
    """A clip over ``max_clip_bytes`` or ``max_clip_seconds``."""

    status = 413


class VoiceStoreFull(VoiceStoreError):
    """The count, total or names bound is reached, and no clip without a name is left to remove."""

    status = 413


class VoiceConflict(VoiceStoreError):
    """The name is taken and ``replace`` was not asked."""

    status = 409


class VoiceNotFound(VoiceStoreError):
    """No voice has that id or name."""

    status = 404


_DEFAULT_LIMITS = VoiceLimits()


class VoiceStore:
    """Named reference clips in ``directory`` (created, mode 0700, by the first change), bounded by ``limits``.

    Until then a missing directory is an empty store: a sidecar whose ``--voice-dir`` is
    read-only starts, serves the clips in it, and refuses ``register_voice`` with the reason.

    Safe to use from several threads and several processes at once.  ``lock_timeout`` bounds
    the wait for another process's change to end (:class:`VoiceStoreError`, 503, after it).
    """

    def __init__(self, directory: str, limits: VoiceLimits = _DEFAULT_LIMITS, *, lock_timeout: float = 10.0) -> None:
        for name in ("max_clip_bytes", "max_clips", "max_total_bytes", "max_names", "max_clip_seconds"):
            if not 0 < getattr(limits, name) < math.inf:
                raise ValueError(f"VoiceLimits.{name} must be positive and finite")
        self.directory = os.path.realpath(directory)
        self.limits = limits
        self.lock_timeout = lock_timeout
        self._cache_lock = threading.Lock()
        self._cache: tuple[tuple[int, int, int], _Index] | None = None
        self._read_index()  # an unreadable index fails now, at start, not at the first request

    # ------------------------------------------------------------------ reading

    def list(self) -> list[VoiceInfo]:
        """Every voice, oldest first."""
        return sorted((entry.info for entry in self._read_index().voices), key=lambda i: (i.created, i.name))

    def get(self, id_or_name: str) -> VoiceInfo:
        """The voice with that id, or else that name (:class:`VoiceNotFound`)."""
        return self._find(self._read_index(), id_or_name).info

    def path(self, id_or_name: str) -> str:
        """The file of the voice's clip, for the engine to read (:class:`VoiceNotFound`)."""
        entry = self._find(self._read_index(), id_or_name)
        path = os.path.join(self.directory, entry.file)
        if not os.path.isfile(path):
            raise VoiceNotFound(f"the clip of voice {entry.info.name!r} is gone from the store", field="name")
        return path

    # ------------------------------------------------------------------ changing

    def add(self, name: str, data: bytes, *, replace: bool = False) -> VoiceInfo:
        """Store ``data`` (an audio clip) under ``name``; with ``replace``, a name already taken gets it.

        Raises :class:`VoiceInvalid`, :class:`VoiceTooLarge`, :class:`VoiceStoreFull` or
        :class:`VoiceConflict`; a refused clip changes nothing.
        """
        check_name(name)
        limits = self.limits
        if not data:
            raise VoiceInvalid("the voice clip is empty", field="audio")
        if len(data) > limits.max_clip_bytes:
            raise VoiceTooLarge(
                f"the voice clip is {len(data)} bytes, more than the limit of {limits.max_clip_bytes} "
                "(--max-voice-bytes)",
                field="audio",
            )
        data = bytes(data)
        self._check_room_for_name(self._read_index(), name, replace)  # before the decoding: cheap refusals first
        audio = probe(data, limits.max_clip_seconds)  # outside the lock: decoding takes a while
        digest = hashlib.sha256(data).hexdigest()
        filename = digest + audio.ext
        with self._locked():
            index = self._read_index()
            old = self._check_room_for_name(index, name, replace)
            info = VoiceInfo(
                id=old.info.id if old is not None else "voice_" + secrets.token_hex(12),
                name=name,
                sha256=digest,
                bytes=len(data),
                duration_s=audio.duration_s,
                sample_rate=audio.sample_rate,
                created=time.time(),
            )
            others = [e for e in index.voices if e.info.name != name]
            kept = {e.file for e in others}
            # The name's old clip, if no other name has it, goes once the index no longer names it
            # (below): counted as gone, but not removed before, so a failed write loses nothing.
            leaving = old.file if old is not None and old.file != filename and old.file not in kept else None
            path = os.path.join(self.directory, filename)
            if not os.path.isfile(path):
                self._make_room(len(data), keep=kept | {old.file} if old is not None else kept, leaving=leaving)
                _write_file(path, data)
            index.voices = [*others, _Entry(info=info, file=filename)]
            self._write_index(index)
            if old is not None and old.file != filename:
                self._drop_unused(old.file, index)
        return info

    def delete(self, id_or_name: str) -> None:
        """Remove the voice with that id (or else that name), and its clip if no other name has it."""
        with self._locked():
            index = self._read_index()
            entry = self._find(index, id_or_name)
            index.voices = [e for e in index.voices if e.info.id != entry.info.id]
            self._write_index(index)
            self._drop_unused(entry.file, index)

    # ------------------------------------------------------------------ inside

    def _check_room_for_name(self, index: _Index, name: str, replace: bool) -> Union[_Entry, None]:
        """The entry ``name`` has now, if any; raise unless ``add(name, replace=replace)`` may go on."""
        old = next((e for e in index.voices if e.info.name == name), None)
        if old is not None and not replace:
            raise VoiceConflict(f"a voice named {name!r} exists already", field="name")
        if old is None and len(index.voices) >= self.limits.max_names:
            raise VoiceStoreFull(
                f"the voice store holds {len(index.voices)} names, its limit (--max-voice-names)", field="name"
            )
        return old

    def _find(self, index: _Index, id_or_name: str) -> _Entry:
        key = "id" if _ID.fullmatch(id_or_name) else "name"
        for entry in index.voices:
            if getattr(entry.info, key) == id_or_name:
                return entry
        shown = id_or_name if len(id_or_name) <= 80 else id_or_name[:80] + "..."
        raise VoiceNotFound(f"no voice has the {key} {shown!r}", field="name")

    def _clips(self) -> builtins.list[tuple[str, os.stat_result]]:
        """The clip files on disk, with their stat (under the lock)."""
        found = []
        for name in os.listdir(self.directory):
            if _CLIP.fullmatch(name):
                try:
                    found.append((name, os.stat(os.path.join(self.directory, name))))
                except FileNotFoundError:  # pragma: no cover - removed by hand meanwhile
                    continue
        return found

    def _make_room(self, size: int, keep: set[str], leaving: Union[str, None]) -> None:
        """Remove clips no name refers to, oldest first, until one more of ``size`` bytes fits.

        ``keep`` are never removed; ``leaving`` (one of them) is not counted: it goes after.
        """
        limits = self.limits
        clips = [c for c in self._clips() if c[0] != leaving]
        total = sum(st.st_size for _, st in clips)
        spare = sorted((c for c in clips if c[0] not in keep), key=lambda c: c[1].st_mtime_ns)
        while len(clips) + 1 > limits.max_clips or total + size > limits.max_total_bytes:
            if not spare:
                if len(clips) + 1 > limits.max_clips:
                    what = f"{len(clips)} clips, its limit (--max-voices)"
                else:
                    what = f"{total} bytes of clips; {size} more would pass its limit of {limits.max_total_bytes} "
                    what += "(--max-voice-total-bytes)"
                raise VoiceStoreFull(f"the voice store holds {what}, all of them named", field="audio")
            victim = spare.pop(0)
            _unlink(os.path.join(self.directory, victim[0]))
            clips.remove(victim)
            total -= victim[1].st_size

    def _drop_unused(self, filename: str, index: _Index) -> None:
        if all(e.file != filename for e in index.voices):
            _unlink(os.path.join(self.directory, filename))

    def _read_index(self) -> _Index:
        path = os.path.join(self.directory, INDEX_FILE)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                with self._cache_lock:
                    if self._cache is not None and self._cache[0] == key:
                        return _copy(self._cache[1])
                raw = f.read()
        except FileNotFoundError:
            return _Index()
        except OSError as exc:
            raise _io_error(exc, "read") from None
        try:
            index = msgspec.json.decode(raw, type=_Index)
        except msgspec.DecodeError:
            raise VoiceStoreError(f"the voice store's {INDEX_FILE} is unreadable; fix or remove it") from None
        if index.version != _INDEX_VERSION:
            raise VoiceStoreError(
                f"the voice store's {INDEX_FILE} has version {index.version}; this version reads {_INDEX_VERSION}"
            )
        with self._cache_lock:
            self._cache = (key, index)
        return _copy(index)

    def _write_index(self, index: _Index) -> None:
        _write_file(os.path.join(self.directory, INDEX_FILE), msgspec.json.encode(index))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store's lock; a failed write inside becomes a :class:`VoiceStoreError` without a path."""
        import fcntl

        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd = os.open(os.path.join(self.directory, _LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise _io_error(exc) from None
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= deadline:
                    raise VoiceStoreError(
                        f"the voice store stayed locked by another process for {self.lock_timeout} s", status=503
                    )
                time.sleep(0.005)  # flock has no timed wait; another process's change takes milliseconds
            self._sweep_temp_files()
            yield
        except OSError as exc:
            raise _io_error(exc) from None
        finally:
            os.close(fd)  # releases the lock

    def _sweep_temp_files(self) -> None:
        """Remove files a writer left when it died mid-write (under the lock, so none is being written)."""
        for name in os.listdir(self.directory):
            if name.startswith(_TEMP_PREFIX):
                _unlink(os.path.join(self.directory, name))


def check_name(name: str) -> None:
    """Raise :class:`VoiceInvalid` unless ``name`` may name a voice."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:80] + "..."
        raise VoiceInvalid(
            f"voice name {shown} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            field="name",
        )
    if _ID.fullmatch(name):
        raise VoiceInvalid(f"voice name {name!r} has the form of a voice id", field="name")


def _io_error(exc: OSError, doing: str = "write") -> VoiceStoreError:
    """The store's error for a failed file operation: its reason, never its path."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = exc.strerror or type(exc).__name__
    return VoiceStoreError(f"the voice store cannot {doing}: {reason}", status=507 if full else 500)


def _copy(index: _Index) -> _Index:
    return _Index(version=index.version, voices=list(index.voices))


def _write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (aside, synced, renamed)."""
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, _TEMP_PREFIX + secrets.token_hex(8))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------- decoding


class Audio(msgspec.Struct, frozen=True):
    """What decoding a clip found."""

    #: The stored file's extension, by container (engines pick a decoder by it).
    ext: str
    sample_rate: int
    duration_s: float


#: Leading bytes -> (extension, decoder, PyAV's demuxer).  Only these containers are opened:
#: a demuxer chosen by probing (playlists, concat lists) could make FFmpeg open other files.
def _sniff(data: bytes) -> Union[tuple[str, str, str], None]:
    head = data[:12]
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return ".wav", "wave", "wav"
    if head[:4] == b"fLaC":
        return ".flac", "soundfile", "flac"
    if head[:4] == b"OggS":
        return ".ogg", "soundfile", "ogg"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return ".aiff", "soundfile", "aiff"
    if head[:3] == b"ID3":
        return ".mp3", "soundfile", "mp3"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        if head[1] & 0x06 == 0:  # layer bits 00: ADTS (AAC), not MPEG audio
            return ".aac", "av", "aac"
        return ".mp3", "soundfile", "mp3"
    if head[4:8] == b"ftyp":
        return ".m4a", "av", "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return ".webm", "av", "matroska"
    return None


def probe(data: bytes, max_seconds: float = _DEFAULT_LIMITS.max_clip_seconds) -> Audio:
    """Decode ``data`` whole; raise :class:`VoiceInvalid` unless it is audio, :class:`VoiceTooLarge` if too long."""
    kind = _sniff(data)
    if kind is None:
        raise VoiceInvalid(
            "the voice clip is not audio in a known container (WAV, FLAC, Ogg, MP3, AIFF, M4A, AAC, WebM)",
            field="audio",
        )
    ext, decoder, demuxer = kind
    decoders = {
        "wave": (_decode_soundfile, _decode_wave),  # the standard library's, where soundfile is missing
        "soundfile": (_decode_soundfile, _decode_av),
        "av": (_decode_av,),
    }[decoder]
    missing = []
    for decode in decoders:
        try:
            rate, frames = decode(data, demuxer, max_seconds)
        except ImportError as exc:
            missing.append(exc.name or "a decoder")
            continue
        except _TooLong as exc:
            raise VoiceTooLarge(
                f"the voice clip is longer than the limit of {max_seconds:g} s (--max-voice-seconds)", field="audio"
            ) from exc
        except _NotAudio as exc:
            raise VoiceInvalid(
                f"the voice clip does not decode as {demuxer.upper()} audio: {exc}", field="audio"
            ) from None
        return Audio(ext=ext, sample_rate=rate, duration_s=frames / rate)
    raise VoiceStoreError(
        f"this server cannot decode {demuxer.upper()} clips: install {' or '.join(missing)}", field="audio", status=415
    )


class _NotAudio(Exception):
    pass


class _TooLong(Exception):
    pass


def _check_format(rate: int, channels: int) -> None:
    if not _MIN_RATE <= rate <= _MAX_RATE:
        raise _NotAudio(f"a sample rate of {rate} Hz is outside {_MIN_RATE}..{_MAX_RATE}")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise _NotAudio(f"{channels} channels (1 to {_MAX_CHANNELS} are accepted)")


def _check_frames(frames: int, rate: int, max_seconds: float) -> None:
    if frames > max_seconds * rate:
        raise _TooLong


def _decode_wave(data: bytes, demuxer: str, max_seconds: float) -> tuple[int, int]:
    import wave

    try:
        with wave.open(io.BytesIO(data)) as f:
            rate, channels, width = f.getframerate(), f.getnchannels(), f.getsampwidth()
            _check_format(rate, channels)
            frames = 0
            while chunk := f.readframes(65536):
                frames += len(chunk) // (width * channels)
                _check_frames(frames, rate, max_seconds)
    except (wave.Error, EOFError) as exc:
        raise _NotAudio(_short(exc)) from None
    if frames == 0:
        raise _NotAudio("it holds no samples")
    return rate, frames


def _decode_soundfile(data: bytes, demuxer: str, max_seconds: float) -> tuple[int, int]:
    import soundfile  # type: ignore[import-untyped]

    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            rate, channels = f.samplerate, f.channels
            _check_format(rate, channels)
            frames = 0
            # Whole, in blocks: a header that promises more than the data holds fails here.
            for block in f.blocks(blocksize=65536, dtype="int16"):
                frames += len(block)
                _check_frames(frames, rate, max_seconds)
    except (RuntimeError, soundfile.LibsndfileError) as exc:
        raise _NotAudio(_short(exc)) from None
    if frames == 0:
        raise _NotAudio("it holds no samples")
    return rate, frames


def _decode_av(data: bytes, demuxer: str, max_seconds: float) -> tuple[int, int]:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            streams = container.streams.audio
            if not streams:
                raise _NotAudio("it has no audio stream")
            stream = streams[0]
            rate: Any = stream.rate or stream.codec_context.sample_rate
            _check_format(int(rate or 0), int(stream.codec_context.channels or 0))
            frames = 0
            for frame in container.decode(stream):
                frames += frame.samples
                _check_frames(frames, rate, max_seconds)
    except av.FFmpegError as exc:
        raise _NotAudio(_short(exc)) from None
    if frames == 0:
        raise _NotAudio("it holds no samples")
    return int(rate), frames


def _short(exc: BaseException) -> str:
    """A decoder's complaint without anything that could be a path (BytesIO has none, but be sure)."""
    text = re.sub(r"^Error opening <[^>]*>: ", "", str(exc).replace("\n", " "))
    text = re.sub(r"(/[^\s'\"]+)+", "<file>", text)
    return text[:200] or type(exc).__name__

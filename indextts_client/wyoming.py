"""A Wyoming server (Home Assistant's voice protocol) over a pool of sidecars (extra ``[wyoming]``).

::

    indextts-client wyoming --uri tcp://0.0.0.0:10200 --engine indextts2 --python ENGINE_PYTHON \\
        -o model_dir=/models/IndexTTS-2 --voice alice=/voices/alice.wav --voice-dir /voices

Built on the ``wyoming`` package's :class:`~wyoming.server.AsyncServer` (``tcp://`` or
``unix://``) and :class:`~wyoming.server.AsyncEventHandler`, one handler per connection:

* ``describe`` -> ``info``: one TTS program whose voices are the ``--voice`` names and the
  files of ``--voice-dir``, in ``--language`` languages, with streamed synthesis supported;
* ``synthesize`` (the whole text) -> ``audio-start``, ``audio-chunk``..., ``audio-stop``, the
  chunks sent as the engine makes them;
* ``synthesize-start``, ``synthesize-chunk``..., ``synthesize-stop`` -> per sentence, as soon as
  it is complete, one ``audio-start``/``audio-chunk``.../``audio-stop`` cycle, then
  ``synthesize-stopped`` (through :meth:`Pool.stream_text`: the next sentence is already
  queued on the sidecar while one plays).  A ``synthesize`` that arrives during a streamed
  request (Home Assistant sends both, for servers that do not stream) is ignored.

Audio is 16-bit mono at the engine's rate.  The wyoming package runs on asyncio only, so this
server does too.  Every event, text, connection and wait is bounded (see :class:`Limits`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union
from urllib.parse import urlparse

import anyio

from indextts_sidecar import __version__
from indextts_sidecar.protocol.options import parse_options

from ._exceptions import (
    BusyError,
    ClosedError,
    CrashedError,
    InvalidRequestError,
    RequestTimeoutError,
    RestartLimitError,
    SidecarError,
    StartError,
)
from ._pool import Pool
from ._pool_cli import add_pool_arguments, pool_kwargs
from ._stream_text import SentenceChunk, TextFeed

try:
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.error import Error
    from wyoming.event import Event, async_write_event
    from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
    from wyoming.server import AsyncEventHandler, AsyncServer, AsyncTcpServer, AsyncUnixServer
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"indextts_client.wyoming needs the [wyoming] extra: pip install wyoming sentence-stream ({exc})"
    ) from exc

__all__ = ["Limits", "WyomingService", "add_pool_arguments", "main", "pool_from_arguments", "serve"]

log = logging.getLogger(__name__)

#: Suffixes of the reference clips ``--voice-dir`` offers as voices.
VOICE_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")
_ATTRIBUTION = Attribution(name="indextts-sidecar", url="https://pypi.org/project/indextts-sidecar/")


@dataclass(frozen=True)
class Limits:
    """What one client may make the server hold or wait for (flags in brackets)."""

    #: Connections served at once; one more is answered with an error and closed [--max-connections].
    max_connections: int = 64
    #: Bytes of one event's header line, its data and its payload, each [--max-event-bytes].
    max_event_bytes: int = 64 * 1024
    #: Characters of one request's text: a ``synthesize``, or a whole streamed request [--max-text-chars].
    max_text_chars: int = 20_000
    #: Seconds a connection may stay silent between events before it is closed [--idle-timeout].
    idle_timeout: float = 60.0
    #: Seconds one event may take to reach a client that does not read [--write-timeout].
    write_timeout: float = 30.0


class _TooLarge(Exception):
    pass


async def _read_event(reader: asyncio.StreamReader, limit: int) -> Union[Event, None]:
    """The wyoming framing (a JSON line, then data, then payload), each part at most ``limit`` bytes.

    The package's own reader takes any ``data_length``/``payload_length`` a client states.
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise _TooLarge(f"an event header is longer than {limit} bytes") from None
    if len(line) > limit:
        raise _TooLarge(f"an event header is longer than {limit} bytes")
    try:
        header = json.loads(line)
    except ValueError:
        raise _TooLarge("an event header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise _TooLarge("an event header has no type")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise _TooLarge("an event's data is not an object")
    sizes = []
    for key in ("data_length", "payload_length"):
        size = header.get(key) or 0
        if not isinstance(size, int) or size < 0 or size > limit:
            raise _TooLarge(f"an event's {key} is not a size of at most {limit} bytes")
        sizes.append(size)
    try:
        if sizes[0]:
            extra = json.loads(await reader.readexactly(sizes[0]))
            if not isinstance(extra, dict):
                raise _TooLarge("an event's data is not an object")
            data.update(extra)
        payload = await reader.readexactly(sizes[1]) if sizes[1] else None
    except asyncio.IncompleteReadError:
        return None
    except ValueError:
        raise _TooLarge("an event's data is not JSON") from None
    return Event(type=header["type"], data=data, payload=payload)


def _client_error(exc: BaseException) -> Error:
    """What a client is told of a failure: a code and a plain sentence, never a path or a traceback."""
    if isinstance(exc, InvalidRequestError):
        field = exc.detail.get("field")
        where = f" in {field}" if isinstance(field, str) and field.startswith("$.") else ""
        return Error(f"invalid request{where} ({exc.code})", code=exc.code)
    if isinstance(exc, BusyError):
        return Error("busy: every engine is full; try again", code="busy")
    if isinstance(exc, RequestTimeoutError):
        return Error("the synthesis timed out", code="timeout")
    if isinstance(exc, (StartError, RestartLimitError, ClosedError, CrashedError)):
        return Error("the TTS engine is unavailable", code="unavailable")
    code = getattr(exc, "code", None)
    return Error(f"the synthesis failed ({code or 'error'})", code=code if isinstance(code, str) else "error")


def _reap(task: asyncio.Task[None]) -> None:
    """Log what a finished speaker task raised beyond the errors it reports to its client."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("wyoming: a synthesis task failed", exc_info=exc)


class WyomingService:
    """What every connection shares: the pool, the voices, the languages, the limits."""

    def __init__(
        self,
        pool: Pool,
        *,
        voices: Union[dict[str, Union[str, None]], None] = None,
        languages: Sequence[str] = ("en", "zh"),
        default_voice: Union[str, None] = None,
        limits: Limits = Limits(),
        options: Union[dict[str, Any], None] = None,
    ) -> None:
        self.pool = pool
        self.voices = dict(voices or {})
        self.languages = list(languages)
        if default_voice is not None and default_voice not in self.voices:
            raise ValueError(f"default voice {default_voice!r} is not one of the voices")
        self.default_voice = default_voice if default_voice is not None else next(iter(self.voices), None)
        self.limits = limits
        #: Request options for every synthesis (engine-specific).
        self.options = dict(options or {})
        #: Connections being served now.
        self.connections = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Until no connection is being served (each one's requests cancelled or finished)."""
        await self._idle.wait()

    def _enter(self) -> None:
        self.connections += 1
        self._idle.clear()

    def _leave(self) -> None:
        self.connections -= 1
        if self.connections == 0:
            self._idle.set()

    def info(self) -> Info:
        voices = [
            TtsVoice(
                name=name,
                attribution=_ATTRIBUTION,
                installed=True,
                description=name,
                version=None,
                languages=list(self.languages),
            )
            for name in self.voices
        ]
        program = TtsProgram(
            name="indextts-sidecar",
            attribution=_ATTRIBUTION,
            installed=True,
            description="IndexTTS (or another engine) in sidecar processes",
            version=__version__,
            voices=voices,
            supports_synthesize_streaming=True,
        )
        return Info(tts=[program])

    def voice(self, name: Union[str, None]) -> Union[str, None]:
        """The sidecar's voice for a requested voice name; raises ``KeyError`` for an unknown one."""
        if name is None:
            return None if self.default_voice is None else self.voices[self.default_voice]
        return self.voices[name]

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Handler:
        return Handler(self, reader, writer)


class Handler(AsyncEventHandler):
    """One connection."""

    def __init__(self, service: WyomingService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.service = service
        self._feed: Union[TextFeed, None] = None
        self._speaker: Union[asyncio.Task[None], None] = None
        self._streamed_chars = 0

    async def run(self) -> None:
        """Read events under the limits until the client leaves, goes silent or breaks them."""
        service, limits = self.service, self.service.limits
        if service.connections >= limits.max_connections:
            try:
                await self.write_event(
                    Error(f"too many connections (at most {limits.max_connections})", code="busy").event()
                )
            except (OSError, asyncio.TimeoutError):
                pass
            self.writer.close()
            return
        service._enter()
        self._is_running = True
        try:
            while self._is_running:
                try:
                    event = await asyncio.wait_for(
                        _read_event(self.reader, limits.max_event_bytes), timeout=limits.idle_timeout
                    )
                except asyncio.TimeoutError:
                    log.info("wyoming: a connection was silent for %g s; closing it", limits.idle_timeout)
                    break
                except _TooLarge as exc:
                    await self._write_quietly(Error(str(exc), code="invalid_event").event())
                    break
                if event is None or not await self.handle_event(event):
                    break
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("wyoming: connection lost: %s", exc)
        finally:
            try:
                await self.disconnect()
                self.writer.close()
            finally:
                service._leave()

    async def write_event(self, event: Event) -> None:
        await asyncio.wait_for(async_write_event(event, self.writer), timeout=self.service.limits.write_timeout)

    async def _write_quietly(self, event: Event) -> None:
        try:
            await self.write_event(event)
        except (OSError, asyncio.TimeoutError):
            pass

    async def disconnect(self) -> None:
        """The client left: cancel what it asked for (the running and queued sentences)."""
        speaker, self._speaker = self._speaker, None
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.stop()
        if speaker is not None:
            speaker.cancel()
            await asyncio.wait([speaker])
            _reap(speaker)

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.service.info().event())
            return True
        if SynthesizeStart.is_type(event.type):
            return await self._start(SynthesizeStart.from_event(event))
        if SynthesizeChunk.is_type(event.type):
            return await self._chunk(SynthesizeChunk.from_event(event))
        if SynthesizeStop.is_type(event.type):
            return await self._stop()
        if Synthesize.is_type(event.type):
            if self._feed is not None:
                return True  # the same text as the streamed request's, for servers that do not stream
            return await self._synthesize(event)
        log.debug("wyoming: ignoring a %r event", event.type)
        return True

    # ------------------------------------------------------------ whole text

    async def _synthesize(self, event: Event) -> bool:
        try:
            request = Synthesize.from_event(event)
        except (KeyError, TypeError, ValueError):
            await self.write_event(Error("a synthesize event needs a text", code="invalid_event").event())
            return True
        text = request.text
        if not isinstance(text, str) or len(text) > self.service.limits.max_text_chars:
            limit = self.service.limits.max_text_chars
            await self.write_event(
                Error(f"text must be a string of at most {limit} characters", code="too_long").event()
            )
            return True
        voice = self._voice(request.voice.name if request.voice is not None else None)
        if isinstance(voice, Error):
            await self.write_event(voice.event())
            return True
        await self._wait_speaker()
        self._speaker = asyncio.create_task(self._speak_whole(text, voice), name="wyoming speaker")
        return True

    async def _wait_speaker(self) -> None:
        """Let the request before this one end first (its audio goes out before this one's)."""
        speaker = self._speaker
        if speaker is not None:
            await asyncio.wait([speaker])
            self._speaker = None
            _reap(speaker)

    async def _speak_whole(self, text: str, voice: Union[str, None]) -> None:
        """A ``synthesize``: one audio cycle, the chunks sent as they come.  Runs in a task of its
        own, so that the connection's reader sees the client leave and cancels it."""
        try:
            async with self.service.pool.stream(text, voice=voice, **self.service.options) as chunks:
                started = False
                rate = 0
                async for chunk in chunks:
                    if not started:
                        rate, started = chunk.sample_rate, True
                        await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                    await self.write_event(
                        AudioChunk(rate=rate, width=2, channels=1, audio=chunk.samples.tobytes()).event()
                    )
            if not started:
                await self.write_event(AudioStart(rate=self._rate(), width=2, channels=1).event())
            await self.write_event(AudioStop().event())
        except SidecarError as exc:
            log.warning("wyoming: synthesis failed: %s", exc)
            await self._write_quietly(_client_error(exc).event())
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("wyoming: could not send the audio: %s", exc)
            self.writer.close()

    def _rate(self) -> int:
        try:
            rate = self.service.pool.members[0].info.sample_rate
        except RuntimeError:
            rate = None
        return int(rate) if rate else 24000

    def _voice(self, name: Union[str, None]) -> Union[str, Error, None]:
        if name is not None and not isinstance(name, str):
            return Error("a voice name is a string", code="invalid_event")
        try:
            return self.service.voice(name)
        except KeyError:
            return Error("unknown voice; describe lists the voices", code="unknown_voice")

    # ------------------------------------------------------------ streamed text

    async def _start(self, request: SynthesizeStart) -> bool:
        if self._feed is not None:
            await self.write_event(Error("a streamed synthesis is already open", code="invalid_event").event())
            return False
        voice = self._voice(request.voice.name if request.voice is not None else None)
        if isinstance(voice, Error):
            await self.write_event(voice.event())
            return True
        await self._wait_speaker()
        feed = self._feed = TextFeed()
        self._streamed_chars = 0
        self._speaker = asyncio.create_task(self._speak(feed, voice), name="wyoming speaker")
        return True

    async def _chunk(self, request: SynthesizeChunk) -> bool:
        feed = self._feed
        if feed is None:
            await self.write_event(Error("synthesize-chunk before synthesize-start", code="invalid_event").event())
            return True
        text = request.text
        if not isinstance(text, str):
            await self.write_event(Error("synthesize-chunk needs a text", code="invalid_event").event())
            return False
        self._streamed_chars += len(text)
        limit = self.service.limits.max_text_chars
        if self._streamed_chars > limit:
            await self.write_event(Error(f"a streamed text is at most {limit} characters", code="too_long").event())
            return False
        try:
            await feed.send(text)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False  # the speaker is gone (the client stopped reading): close the connection
        return True

    async def _stop(self) -> bool:
        """The end of the text: the speaker says what is left, then ``synthesize-stopped``.

        Not awaited here: the reader goes on reading, so a client that leaves now still
        cancels what is queued.
        """
        feed, self._feed = self._feed, None
        if feed is None:
            await self.write_event(Error("synthesize-stop before synthesize-start", code="invalid_event").event())
            return True
        feed.close()
        return True

    async def _speak(self, feed: TextFeed, voice: Union[str, None]) -> None:
        """The audio of a streamed request, one audio-start/chunk/stop cycle per sentence."""
        try:
            stream = self.service.pool.stream_text(feed, voice=voice, **self.service.options)
            async with stream:
                async for item in stream.events():
                    if isinstance(item, SentenceChunk):
                        rate = item.sample_rate
                        if item.seq == 0:
                            await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                        await self.write_event(
                            AudioChunk(rate=rate, width=2, channels=1, audio=item.samples.tobytes()).event()
                        )
                    else:
                        await self.write_event(AudioStop().event())
            await self.write_event(SynthesizeStopped().event())
        except SidecarError as exc:
            log.warning("wyoming: streamed synthesis failed: %s", exc)
            await self._write_quietly(_client_error(exc).event())
            await self._write_quietly(SynthesizeStopped().event())
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("wyoming: could not send the audio: %s", exc)
            self.writer.close()
        finally:
            feed.stop()


# ---------------------------------------------------------------------- command line


def pool_from_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Pool:
    """The pool that :func:`add_pool_arguments`' options describe."""
    return Pool(args.engine, **pool_kwargs(args, parser))


def _voices(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Union[str, None]]:
    voices: dict[str, Union[str, None]] = {}
    for item in args.voice:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--voice {item!r} is not NAME=VALUE")
        voices[name] = value or None
    if args.voice_dir is not None:
        folder = Path(args.voice_dir)
        if not folder.is_dir():
            parser.error(f"--voice-dir {args.voice_dir!r} is not a directory")
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.suffix.lower() in VOICE_SUFFIXES:
                voices.setdefault(path.stem, str(path.resolve()))
    return voices


async def serve(
    service: WyomingService,
    uri: str,
    *,
    zeroconf: Union[str, None] = None,
    ready: Union[Any, None] = None,
    handle_signals: bool = True,
) -> None:
    """Start the pool, listen on ``uri`` and serve until cancelled or SIGTERM/SIGINT.

    ``ready(address)`` hears the bound address (a ``tcp://HOST:PORT`` with the real port).
    """
    parsed = urlparse(uri)
    if parsed.scheme not in ("tcp", "unix"):
        raise ValueError(f"--uri {uri!r}: give tcp://HOST:PORT or unix:///PATH")
    server = AsyncServer.from_uri(uri)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for signum in signals:
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass
    async with service.pool:
        await server.start(service.handler)
        try:
            address = uri
            listening: Any = getattr(server, "_server", None)
            if isinstance(server, AsyncTcpServer) and listening is not None:
                host, port = listening.sockets[0].getsockname()[:2]
                address = f"tcp://{host}:{port}"
                if zeroconf is not None:
                    await _announce(port, zeroconf or None)
            elif isinstance(server, AsyncUnixServer):
                address = f"unix://{server.socket_path}"
            log.warning("wyoming: listening on %s", address)
            if ready is not None:
                ready(address)
            await stop.wait()
        finally:
            await server.stop()
            # The handlers saw their streams end: let them cancel their requests before the pool stops.
            try:
                await asyncio.wait_for(service.wait_idle(), timeout=5.0)
            except asyncio.TimeoutError:  # pragma: no cover - a handler stuck past its write timeout
                log.warning("wyoming: %d connections still open at shutdown", service.connections)
            for signum in signals:
                try:
                    loop.remove_signal_handler(signum)
                except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover
                    pass


async def _announce(port: int, name: Union[str, None]) -> None:
    try:
        from wyoming.zeroconf import HomeAssistantZeroconf
    except ImportError as exc:
        raise RuntimeError(f"--zeroconf needs the zeroconf package: pip install zeroconf ({exc})") from None
    await HomeAssistantZeroconf(port=port, name=name).register_server()


def main(argv: Union[list[str], None] = None, prog: str = "indextts-client wyoming") -> int:
    """``indextts-client wyoming --uri tcp://HOST:PORT``: a Wyoming TTS server over a pool."""
    parser = argparse.ArgumentParser(prog=prog, description="A Wyoming (Home Assistant) TTS server.")
    parser.add_argument("--uri", required=True, help="tcp://HOST:PORT or unix:///PATH (port 0: any free port)")
    add_pool_arguments(parser)
    parser.add_argument("--voice", action="append", default=[], metavar="NAME=VALUE", help="offer a voice")
    parser.add_argument("--voice-dir", help="offer each .wav/.flac/.mp3/.ogg file here as a voice named by its stem")
    parser.add_argument("--default-voice", help="the voice when a request names none (default: the first)")
    parser.add_argument("--language", action="append", default=None, help="a language the voices speak (en, zh)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="request option")
    parser.add_argument("--zeroconf", nargs="?", const="", default=None, metavar="NAME", help="announce on mDNS")
    defaults = Limits()
    limit = parser.add_argument
    limit("--max-connections", type=int, default=defaults.max_connections, help="connections at once (%(default)s)")
    limit("--max-event-bytes", type=int, default=defaults.max_event_bytes, help="bytes per event part (%(default)s)")
    limit("--max-text-chars", type=int, default=defaults.max_text_chars, help="characters a request (%(default)s)")
    limit("--idle-timeout", type=float, default=defaults.idle_timeout, help="seconds between events (%(default)s)")
    limit("--write-timeout", type=float, default=defaults.write_timeout, help="seconds an event's send (%(default)s)")
    args = parser.parse_args(argv)
    voices = _voices(args, parser)
    try:
        options = parse_options(args.set)
    except ValueError as exc:
        parser.error(str(exc))
    limits = Limits(
        max_connections=args.max_connections,
        max_event_bytes=args.max_event_bytes,
        max_text_chars=args.max_text_chars,
        idle_timeout=args.idle_timeout,
        write_timeout=args.write_timeout,
    )
    if min(limits.max_connections, limits.max_event_bytes, limits.max_text_chars) < 1:
        parser.error("the --max-* limits must be >= 1")
    if not (limits.idle_timeout > 0 and limits.write_timeout > 0):
        parser.error("--idle-timeout and --write-timeout must be > 0")
    try:
        service = WyomingService(
            pool_from_arguments(args, parser),
            voices=voices,
            languages=args.language or ("en", "zh"),
            default_voice=args.default_voice,
            limits=limits,
            options=options,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        asyncio.run(serve(service, args.uri, zeroconf=args.zeroconf))
    except ValueError as exc:
        parser.error(str(exc))
    except (StartError, RuntimeError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

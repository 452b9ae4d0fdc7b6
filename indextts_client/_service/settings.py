"""The serving flags every server shares, parsed once into frozen settings.

``add_voice_arguments`` defines ``--voice``, ``--voice-dir`` and the voice store's bounds (their
defaults read from :class:`VoiceLimits`, said there once), ``add_ssml_arguments`` the bound on an
SSML request's breaks (``--max-silence``); :meth:`ServeSettings.from_args` turns them and the
pool's flags (:mod:`indextts_client._pool._cli`) into one frozen value.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, Union

from indextts_sidecar.voicestore import VoiceLimits

from .._defaults import DEFAULT_MAX_SILENCE
from .._pool._cli import pool_kwargs
from .voices import VoiceSources, parse_voice_map

__all__ = [
    "MAX_SILENCE_BOUND",
    "ServeSettings",
    "add_ssml_arguments",
    "add_voice_arguments",
    "check_max_silence",
    "positive",
]

#: The most ``--max-silence`` may allow: an hour of breaks in one request.
MAX_SILENCE_BOUND = 3600.0


def positive(kind: type) -> Any:
    """An argparse type: a positive ``kind`` (int or float), else the parser's error."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not positive")
        return value

    parse.__name__ = kind.__name__
    return parse


_VOICE_BOUNDS = (
    ("--max-voice-bytes", "max_clip_bytes", int, "bytes of one uploaded clip"),
    ("--max-voices", "max_clips", int, "stored clips"),
    ("--max-voice-total-bytes", "max_total_bytes", int, "bytes of all stored clips"),
    ("--max-voice-names", "max_names", int, "voice names"),
    ("--max-voice-seconds", "max_clip_seconds", float, "seconds of one uploaded clip"),
)


class ArgumentTaker(Protocol):
    """A parser or one of its argument groups (``parser.add_argument_group(...)``)."""

    def add_argument(self, *names: str, **settings: Any) -> argparse.Action: ...


def add_voice_arguments(parser: argparse.ArgumentParser, bounds: Union[ArgumentTaker, None] = None) -> None:
    """``--voice NAME=VALUE``, ``--voice-dir DIR`` and the store's bounds (in ``bounds``, a group)."""
    parser.add_argument(
        "--voice", action="append", default=[], metavar="NAME=VALUE", help="map a voice name to what the sidecar gets"
    )
    parser.add_argument("--voice-dir", help="reference clips, and where uploaded voices are kept")
    group = bounds if bounds is not None else parser
    defaults = VoiceLimits()
    for flag, attribute, kind, what in _VOICE_BOUNDS:
        group.add_argument(flag, type=positive(kind), default=getattr(defaults, attribute), help=what)


def check_max_silence(seconds: float) -> float:
    """``seconds`` as a server's bound on an SSML request's breaks: > 0 and at most
    :data:`MAX_SILENCE_BOUND` (NaN is neither), else ValueError."""
    if not 0 < seconds <= MAX_SILENCE_BOUND:
        raise ValueError(f"max_silence must be in (0, {MAX_SILENCE_BOUND:g}] seconds, not {seconds!r}")
    return seconds


def _silence_seconds(text: str) -> float:
    """An argparse type: :func:`check_max_silence` of a number, else the parser's error."""
    try:
        return check_max_silence(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds in (0, {MAX_SILENCE_BOUND:g}]") from None


def add_ssml_arguments(group: ArgumentTaker) -> None:
    """``--max-silence SECONDS``: what the breaks of one SSML request may add up to."""
    group.add_argument(
        "--max-silence",
        type=_silence_seconds,
        default=DEFAULT_MAX_SILENCE,
        metavar="SECONDS",
        help=f"seconds of breaks one SSML request may hold in all (default %(default)g, at most {MAX_SILENCE_BOUND:g})",
    )


@dataclass(frozen=True)
class ServeSettings:
    """What a server runs: the pool's arguments, and its voices."""

    engine: str
    #: ``Pool(engine, **pool)``.
    pool: Mapping[str, Any]
    voices: Mapping[str, Union[str, None]] = field(default_factory=dict)
    voice_dir: Union[str, None] = None
    voice_limits: VoiceLimits = field(default_factory=VoiceLimits)
    #: Seconds the breaks of one SSML request may add up to (``--max-silence``).
    max_silence: float = DEFAULT_MAX_SILENCE

    @classmethod
    def from_args(cls, args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServeSettings:
        """From the flags of ``add_pool_arguments``, ``add_voice_arguments`` and ``add_ssml_arguments``;
        a bad one is the parser's error."""
        try:
            voices = parse_voice_map(args.voice)
        except ValueError as exc:
            parser.error(str(exc))
        if args.voice_dir and not os.path.isdir(args.voice_dir):
            parser.error(f"--voice-dir {args.voice_dir!r} is not a directory")
        limits = VoiceLimits(
            **{attribute: getattr(args, flag[2:].replace("-", "_")) for flag, attribute, *_ in _VOICE_BOUNDS}
        )
        return cls(
            engine=args.engine,
            pool=MappingProxyType(pool_kwargs(args, parser)),
            voices=MappingProxyType(voices),
            voice_dir=args.voice_dir or None,
            voice_limits=limits,
            max_silence=args.max_silence,
        )

    def sources(self) -> VoiceSources:
        """The voice sources these settings name."""
        return VoiceSources(self.voices, self.voice_dir, self.voice_limits)

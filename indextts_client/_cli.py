"""``indextts-client``: speak text through a spawned sidecar, or check an engine venv.

    indextts-client say "Hello there." -o hello.wav [--engine espeak] [--python PATH] [--voice REF.wav]
    indextts-client doctor --python PATH [--model-dir DIR]

The console script is not called ``indextts``: upstream IndexTTS installs one of that
name, and both may live in the same venv.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Union

import anyio

from indextts_sidecar._version import __version__

__all__ = ["main"]


def _pairs(values: list[str], what: str) -> dict[str, Any]:
    from indextts_sidecar._main import parse_options

    try:
        return parse_options(values)
    except ValueError as exc:
        raise SystemExit(f"indextts-client: {what}: {exc}") from None


def _emotion(args: argparse.Namespace) -> Any:
    from indextts_sidecar.protocol import EMOTION_NAMES, EmotionAudio, EmotionText, EmotionVector

    chosen = [x for x in (args.emotion, args.emotion_audio, args.emotion_text) if x is not None]
    if len(chosen) > 1:
        raise SystemExit("indextts-client: give at most one of --emotion, --emotion-audio, --emotion-text")
    if args.emotion is not None:
        weights: dict[str, float] = {}
        for part in args.emotion.split(","):
            name, sep, value = part.partition("=")
            if not sep or name.strip() not in EMOTION_NAMES:
                raise SystemExit(
                    f"indextts-client: --emotion takes NAME=WEIGHT pairs with names from {', '.join(EMOTION_NAMES)}"
                )
            try:
                weights[name.strip()] = float(value)
            except ValueError:
                raise SystemExit(f"indextts-client: --emotion weight {value!r} is not a number") from None
        return EmotionVector(**weights, alpha=args.emotion_alpha)
    if args.emotion_audio is not None:
        return EmotionAudio(path=args.emotion_audio, alpha=args.emotion_alpha)
    if args.emotion_text is not None:
        return EmotionText(text=args.emotion_text or None, alpha=args.emotion_alpha)
    return None


async def _say(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from . import Client, ProgressEvent, SidecarError

    console = Console(stderr=True)
    text = sys.stdin.read() if args.text == "-" else args.text
    engine_options = _pairs(args.option, "--option")
    request_options = _pairs(args.set, "--set")
    emotion = _emotion(args)
    columns = (
        TextColumn("{task.description:<12}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False, disable=args.quiet) as bars:
        tasks: dict[str, TaskID] = {}

        def on_progress(event: ProgressEvent) -> None:
            task = tasks.get(event.stage)
            if task is None:
                task = tasks[event.stage] = bars.add_task(event.stage, total=1.0)
            if event.fraction is not None:
                bars.update(task, completed=event.fraction)

        try:
            async with Client(
                engine=args.engine,
                python=args.python,
                engine_options=engine_options,
                ready_timeout=args.ready_timeout,
            ) as client:
                audio = await client.synthesize(
                    text,
                    voice=args.voice,
                    emotion=emotion,
                    sample_rate=args.sample_rate,
                    on_progress=on_progress,
                    timeout=args.timeout,
                    **request_options,
                )
        except SidecarError as exc:
            bars.stop()
            # The message may hold brackets (log lines in the stderr tail): never read it as markup.
            console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            return 1
    audio.to_wav(args.output)
    if not args.quiet:
        console.print(
            f"wrote {args.output}: {audio.duration:.2f} s at {audio.sample_rate} Hz ({len(audio)} samples)",
            highlight=False,
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="indextts-client", description="Drive a TTS engine running in a sidecar process."
    )
    parser.add_argument("--version", action="version", version=f"indextts-client {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the sidecar's log lines")
    commands = parser.add_subparsers(dest="command", required=True)

    say = commands.add_parser("say", help="synthesize TEXT into a WAV file")
    say.add_argument("text", metavar="TEXT", help="the text to speak; - reads standard input")
    say.add_argument("-o", "--output", required=True, help="WAV file to write")
    say.add_argument("--engine", default="espeak", help="engine name (default: espeak)")
    say.add_argument("--python", default=None, help="interpreter of the engine's venv (default: this one)")
    say.add_argument("--voice", default=None, help="voice: a reference clip for IndexTTS, a voice name for espeak")
    say.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="engine option (repeatable)")
    say.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="request option (repeatable)")
    say.add_argument("--emotion", default=None, metavar="NAME=W,...", help="emotion weights, e.g. happy=0.6,calm=0.2")
    say.add_argument("--emotion-audio", default=None, metavar="REF.wav", help="emotion from a reference clip")
    say.add_argument("--emotion-text", default=None, metavar="TEXT", help="emotion from a description")
    say.add_argument("--emotion-alpha", type=float, default=1.0, help="emotion strength, 0..1 (default 1)")
    say.add_argument("--sample-rate", type=int, default=None, help="resample to this rate (default: native)")
    say.add_argument("--timeout", type=float, default=None, help="overall seconds for the request")
    say.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for the sidecar to start")
    say.add_argument("-q", "--quiet", action="store_true", help="no progress bars")

    doctor = commands.add_parser("doctor", help="check an engine venv: versions, GPU, indextts, checkpoints")
    doctor.add_argument("--python", required=True, help="interpreter of the engine's venv")
    doctor.add_argument("--model-dir", default=None, help="checkpoint directory to check")
    return parser


def main(argv: Union[list[str], None] = None) -> int:
    args = _parser().parse_args(argv)
    # Without -v, failures speak through the error message (with the stderr tail), not through logs.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(name)s: %(message)s")
    if args.command == "doctor":
        from ._doctor import doctor_command

        return doctor_command(args.python, args.model_dir)
    try:
        return anyio.run(_say, args)
    except KeyboardInterrupt:
        return 130

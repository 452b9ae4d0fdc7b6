"""``indextts-client``: speak text through a spawned sidecar, list engines, or check an engine venv.

    indextts-client say "Hello there." -o hello.wav [--engine espeak] [--python PATH] [--voice REF.wav] [--ssml]
    indextts-client engines [--python PATH]
    indextts-client doctor [--python PATH] [--engine NAME] [--model-dir DIR]
    indextts-client setup indextts2 [--source github|pypi|PATH] [--torch auto|cpu|cuda|pypi] [--model-dir DIR]
    indextts-client envs [--json] | envs remove ENGINE

The console script is not called ``indextts``: upstream IndexTTS installs one of that
name, and both may live in the same venv.  Every failure is one line on stderr, never a
traceback: exit 2 for a usage error found before any work, 1 for a failed request.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Union

import anyio

from indextts_sidecar import __version__

__all__ = ["main"]

PROG = "indextts-client"
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake found before any work: printed as one line, exit code 2."""


def _pairs(values: list[str], flag: str, kind: str) -> dict[str, Any]:
    from indextts_sidecar.protocol.options import parse_options

    try:
        return parse_options(values, kind)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _emotion(args: argparse.Namespace) -> Any:
    from indextts_sidecar.protocol import EMOTION_NAMES, EmotionAudio, EmotionText, EmotionVector

    chosen = [x for x in (args.emotion, args.emotion_audio, args.emotion_text) if x is not None]
    if len(chosen) > 1:
        raise UsageError("give at most one of --emotion, --emotion-audio, --emotion-text")
    if args.emotion is not None:
        weights: dict[str, float] = {}
        for part in args.emotion.split(","):
            name, sep, value = part.partition("=")
            if not sep or name.strip() not in EMOTION_NAMES:
                raise UsageError(f"--emotion takes NAME=WEIGHT pairs with names from {', '.join(EMOTION_NAMES)}")
            try:
                weight = float(value)
            except ValueError:
                raise UsageError(f"--emotion weight {value!r} is not a number") from None
            # The same range as --emotion-alpha, and as the engines check.
            if not 0.0 <= weight <= 1.0:
                raise UsageError(f"--emotion weight {name.strip()}={value} is outside 0..1")
            weights[name.strip()] = weight
        return EmotionVector(**weights, alpha=args.emotion_alpha)
    if args.emotion_audio is not None:
        return EmotionAudio(path=args.emotion_audio, alpha=args.emotion_alpha)
    if args.emotion_text is not None:
        return EmotionText(text=args.emotion_text or None, alpha=args.emotion_alpha)
    return None


def _output_format(output: str, chosen: Union[str, None]) -> str:
    """The format to write ``output`` in; checks it can be written, before any work."""
    from ._audio import format_for_path, format_of, import_soundfile

    try:
        fmt = format_of(chosen) if chosen else "wav" if output == "-" else format_for_path(output)
        if fmt != "wav":
            import_soundfile()
    except (ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None
    if output == "-":
        return fmt
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write {output}: directory {folder} does not exist")
    if os.path.isdir(output):
        raise UsageError(f"cannot write {output}: it is a directory")
    if not os.access(folder, os.W_OK) or (os.path.exists(output) and not os.access(output, os.W_OK)):
        raise UsageError(f"cannot write {output}: permission denied")
    return fmt


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


def _seconds(text: str) -> float:
    """A number of seconds: finite and positive (a request's or a start's deadline)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is outside 0..1")
    return value


class _PlainBars:
    """Progress for ``say`` without rich (or with -q): nothing drawn."""

    def __enter__(self) -> _PlainBars:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stop(self) -> None:
        pass

    def on_progress(self, event: Any) -> None:
        pass


class _RichBars:
    """Progress bars on stderr, one per stage (needs rich: the [cli] extra)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

        columns = (
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
        )
        self._bars = Progress(*columns, console=Console(stderr=True), transient=False)
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _RichBars:
        self._bars.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bars.__exit__(*exc)

    def stop(self) -> None:
        self._bars.stop()

    def on_progress(self, event: Any) -> None:
        task = self._tasks.get(event.stage)
        if task is None:
            task = self._tasks[event.stage] = self._bars.add_task(event.stage, total=1.0)
        if event.fraction is not None:
            self._bars.update(task, completed=event.fraction)


def _progress_bars(quiet: bool) -> Union[_PlainBars, _RichBars]:
    if quiet:
        return _PlainBars()
    try:
        return _RichBars()
    except ImportError:  # rich is only for the bars: the [cli] extra
        return _PlainBars()


async def _say(args: argparse.Namespace) -> int:
    from . import Client, SidecarError

    fmt = _output_format(args.output, args.format)
    engine_options = _pairs(args.option, "--option", "engine option")
    request_options = _pairs(args.set, "--set", "request option")
    emotion = _emotion(args)
    text = sys.stdin.read() if args.text == "-" else args.text
    sidecar_args = [] if args.max_text is None else ["--max-text", str(args.max_text)]
    with _progress_bars(args.quiet) as bars:
        try:
            async with Client(
                engine=args.engine,
                python=args.python,
                engine_options=engine_options,
                ready_timeout=args.ready_timeout,
                sidecar_args=sidecar_args,
            ) as client:
                audio = await client.synthesize(
                    text,
                    voice=args.voice,
                    emotion=emotion,
                    sample_rate=args.sample_rate,
                    on_progress=bars.on_progress,
                    timeout=args.timeout,
                    text_format="ssml" if args.ssml else "text",
                    **request_options,
                )
        except SidecarError as exc:
            bars.stop()
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    if args.output == "-":
        sys.stdout.buffer.write(audio.to_bytes(fmt))
        sys.stdout.buffer.flush()
        where = "standard output"
    else:
        try:
            audio.to_file(args.output, fmt)
        except OSError as exc:
            print(f"{PROG}: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
        where = args.output
    if not args.quiet:
        print(
            f"wrote {where}: {audio.duration:.2f} s at {audio.sample_rate} Hz ({len(audio)} samples)", file=sys.stderr
        )
    return 0


def _engines(args: argparse.Namespace) -> int:
    from ._engines import list_engines

    python = args.python or sys.executable
    try:
        engines = anyio.run(list_engines, python)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        import msgspec

        sys.stdout.buffer.write(msgspec.json.encode(engines) + b"\n")
        return 0
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:  # a plain table
        print(f"engines in {python}")
        for engine in engines:
            available = "yes" if engine.available else f"no: {engine.problem or ''}"
            rate = f"{engine.native_sample_rate} Hz" if engine.native_sample_rate else "-"
            print(
                f"  {engine.name:<10} {available:<5} {rate:<9} {', '.join(engine.capabilities)}  {engine.description}"
            )
        return 0
    table = Table(title=f"engines in {escape(python)}")
    for column in ("engine", "available", "rate", "capabilities", "description"):
        table.add_column(column, overflow="fold")
    for engine in engines:
        available = "[green]yes[/]" if engine.available else f"[red]no[/]: {escape(engine.problem or '')}"
        rate = f"{engine.native_sample_rate} Hz" if engine.native_sample_rate else "-"
        table.add_row(
            escape(engine.name), available, rate, escape(", ".join(engine.capabilities)), escape(engine.description)
        )
    Console().print(table)
    return 0


def _add_wyoming_parser(commands: Any) -> None:
    wyoming = commands.add_parser(
        "wyoming",
        help="a Wyoming (Home Assistant) TTS server over a pool of sidecars (wyoming -h for its options)",
        add_help=False,
    )
    wyoming.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _missing_extra(command: str, exc: ImportError, extra: Union[str, None] = None) -> str:
    """The one line for a command whose extra is not installed: what is missing and what to install."""
    extra = extra or command
    if f"[{extra}]" in str(exc):  # the package's own message names it already
        return f"{PROG} {command}: {exc}"
    return f'{PROG} {command}: {exc}: install the [{extra}] extra (from the clone: pip install -e ".[{extra}]")'


def _wyoming(argv: list[str], *, verbose: bool) -> int:
    """``indextts-client wyoming ...``: its own parser, in indextts_client.wyoming (the [wyoming] extra)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        from .wyoming import main as wyoming
    except ImportError as exc:
        print(_missing_extra("wyoming", exc), file=sys.stderr)
        return EXIT_USAGE
    return wyoming(argv, prog=f"{PROG} wyoming")


def _parser() -> argparse.ArgumentParser:
    # -v is accepted before and after the subcommand; SUPPRESS keeps a later default from
    # overwriting an earlier -v.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show the sidecar's log lines"
    )
    parser = argparse.ArgumentParser(
        prog=PROG, description="Drive a TTS engine running in a sidecar process.", parents=[verbose]
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    say = commands.add_parser("say", help="synthesize TEXT into an audio file", parents=[verbose])
    say.add_argument("text", metavar="TEXT", help="the text to speak; - reads standard input")
    say.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write: .wav, or .flac/.ogg with the audio extra; - writes WAV to standard output",
    )
    say.add_argument("--format", default=None, choices=["wav", "flac", "ogg"], help="overrides the suffix's format")
    say.add_argument("--engine", default="espeak", help="engine name (default: espeak)")
    say.add_argument("--python", default=None, help="interpreter of the engine's venv (default: this one)")
    say.add_argument("--voice", default=None, help="voice: a reference clip for IndexTTS, a voice name for espeak")
    say.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="engine option (repeatable)")
    say.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="request option (repeatable)")
    say.add_argument("--emotion", default=None, metavar="NAME=W,...", help="emotion weights, e.g. happy=0.6,calm=0.2")
    say.add_argument("--emotion-audio", default=None, metavar="REF.wav", help="emotion from a reference clip")
    say.add_argument("--emotion-text", default=None, metavar="TEXT", help="emotion from a description")
    say.add_argument("--emotion-alpha", type=_unit_interval, default=1.0, help="emotion strength, 0..1 (default 1)")
    say.add_argument("--sample-rate", type=int, default=None, help="resample to this rate (default: native)")
    say.add_argument("--timeout", type=_seconds, default=None, help="overall seconds for the request")
    say.add_argument("--ready-timeout", type=_seconds, default=60.0, help="seconds to wait for the sidecar to start")
    say.add_argument(
        "--max-text",
        type=_positive_int,
        default=None,
        metavar="N",
        help="longest text in characters the sidecar accepts (its --max-text; default 100000)",
    )
    say.add_argument(
        "--ssml", action="store_true", help="TEXT is SSML: <speak>, break, phoneme, prosody rate, say-as, sub, lang"
    )
    say.add_argument("-q", "--quiet", action="store_true", help="no progress bars (drawn only when rich is installed)")

    engines = commands.add_parser(
        "engines", help="list the engines a venv has: rate, capabilities, whether each can run", parents=[verbose]
    )
    engines.add_argument("--python", default=None, help="interpreter of the engine's venv (default: this one)")
    engines.add_argument("--json", action="store_true", help="print one JSON list instead of a table")

    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible speech endpoint over a pool of sidecars (serve -h for its options)",
        add_help=False,
    )
    serve.add_argument("arguments", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    _add_wyoming_parser(commands)

    doctor = commands.add_parser(
        "doctor", help="check an engine venv: versions, GPU, indextts, checkpoints", parents=[verbose]
    )
    doctor.add_argument(
        "--python", default=None, help="interpreter of the engine's venv (default: the one setup registered)"
    )
    doctor.add_argument(
        "--engine", default=None, help="the engine to check (default: IndexTTS, whichever flavour is installed)"
    )
    doctor.add_argument("--model-dir", default=None, help="checkpoint directory to check")

    from ._setup._command import add_envs_parser, add_setup_parser

    add_setup_parser(commands, [verbose])
    add_envs_parser(commands, [verbose])
    return parser


def _doctor(args: argparse.Namespace) -> int:
    """``doctor``: the given interpreter, else the environment setup registered for the engine."""
    from indextts_sidecar.protocol.doctor import is_indextts

    from ._doctor import doctor_command

    python, model_dir = args.python, args.model_dir
    if python is None and args.engine is not None and not is_indextts(args.engine):
        return doctor_command(sys.executable, model_dir, args.engine)  # espeak, fake: this interpreter runs them
    if python is None:
        from ._registry import setup_command
        from ._setup._command import registered_for_doctor

        record = registered_for_doctor(args.engine)
        if record is None:
            engine = args.engine or "indextts2"
            raise UsageError(f"no --python and no environment set up for {engine}: run `{setup_command(engine)}`")
        python, model_dir = record.python, model_dir or record.model_dir
        return doctor_command(python, model_dir, args.engine, record.engine_options)
    return doctor_command(python, model_dir, args.engine)


def main(argv: Union[list[str], None] = None) -> int:
    raw = sys.argv[1:] if argv is None else list(argv)
    leading = 0
    while leading < len(raw) and raw[leading] in ("-v", "--verbose"):
        leading += 1
    if raw[leading : leading + 1] == ["serve"]:
        # serve has its own parser (indextts_client.http), which needs the [server] extra.
        if leading:
            logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        try:
            from .http import main as serve
        except ImportError as exc:
            print(_missing_extra("serve", exc, extra="server"), file=sys.stderr)
            return EXIT_USAGE
        return serve(raw[leading + 1 :], prog=f"{PROG} serve")
    if raw[leading : leading + 1] == ["wyoming"]:
        return _wyoming(raw[leading + 1 :], verbose=leading > 0)
    args = _parser().parse_args(argv)
    # Without -v, failures speak through the error message (with the stderr tail), not through logs.
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, format="%(name)s: %(message)s")
    try:
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "setup":
            from . import Client
            from ._setup._command import setup_command_main

            return setup_command_main(args, Client)
        if args.command == "envs":
            from ._setup._command import envs_command

            return envs_command(args)
        if args.command == "engines":
            return _engines(args)
        return anyio.run(_say, args)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130

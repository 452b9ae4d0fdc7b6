"""``indextts-client setup ENGINE`` and ``indextts-client envs``: the steps, their progress, their errors.

setup's steps: the venv (built, or adopted with ``--python``), the checkpoints (downloaded,
or given with ``--model-dir``, or found beside an adopted venv), the auxiliary models, the
verification (the doctor, then one short synthesis), the record.  The record says
"incomplete" from the first step on and "ready" only after the last, so a failure or a
Ctrl-C never leaves a broken environment for discovery to find; the next run picks up what
is on disk (a kept venv, huggingface_hub's partial files).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union

import anyio
import msgspec

from indextts_sidecar import __version__

from .._doctor import QWEN_EMO_DIR
from ._build import (
    SUPPORTED_PYTHONS,
    InstallPlan,
    SetupError,
    create_venv,
    detect_gpu,
    find_uv,
    install,
    lock_constraints,
    python_version,
    self_requirement,
    upstream_requirement,
)
from ._registry import (
    INDEXTTS_ENGINES,
    SETUP_ENGINES,
    EnvRecord,
    indextts_home,
    list_records,
    read_record,
    remove_record,
    write_record,
)

__all__ = ["add_envs_parser", "add_setup_parser", "envs_command", "setup_command_main"]

_VERSION_OF = {"indextts2": "2", "indextts2.5": "2.5"}
#: The test synthesis's cap on mel tokens (several seconds of audio; "Hello." needs about one).
VERIFY_MEL_TOKENS = 200
_ENGINE_OF = {"2": "indextts2", "2.5": "indextts2.5"}


def add_setup_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    setup = commands.add_parser(
        "setup",
        help="build an IndexTTS engine's venv, fetch its checkpoints, verify and register it",
        parents=parents,
        description="Build (or adopt) the engine's venv, fetch the checkpoints and the auxiliary models, verify "
        "with the doctor and one synthesis, and register the environment so that every command finds it.",
    )
    setup.add_argument("engine", choices=SETUP_ENGINES, metavar="ENGINE", help="indextts2 or indextts2.5")
    setup.add_argument(
        "--source",
        default="github",
        help="upstream's code: github (its repository at the commit this release is tested with, the default), "
        "pypi (the repackaging indextts2-inference / indextts25-inference), or the PATH of a local checkout",
    )
    setup.add_argument(
        "--torch",
        default="auto",
        choices=["auto", "cpu", "cuda", "pypi"],
        help="torch build: cuda (PyTorch's cu128 index), cpu (its CPU index), pypi (the ordinary package index); "
        "auto: cuda when a GPU is seen, else cpu",
    )
    setup.add_argument(
        "--installer",
        default="auto",
        choices=["auto", "uv", "pip"],
        help="uv (fast; the cli extra ships it) or venv + pip; auto: uv when available",
    )
    setup.add_argument("--python", default=None, help="adopt the venv of this interpreter instead of building one")
    setup.add_argument("--base-python", default=None, help="the interpreter to build the venv from (3.10 or 3.11)")
    setup.add_argument("--venv", default=None, help="where to build the venv (default: INDEXTTS_HOME/venvs/ENGINE)")
    setup.add_argument(
        "--constraint", action="append", default=[], metavar="FILE", help="pip constraints for the venv (repeatable)"
    )
    setup.add_argument("--model", default=None, metavar="REPO_ID", help="hub repository of the checkpoints")
    setup.add_argument("--model-dir", default=None, help="use the checkpoints in this directory instead")
    setup.add_argument("--no-verify", action="store_true", help="skip the doctor and the test synthesis")
    setup.add_argument("--force", action="store_true", help="rebuild the venv from scratch")
    setup.add_argument("-q", "--quiet", action="store_true", help="no progress")


def add_envs_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    envs = commands.add_parser("envs", help="list the engine environments setup registered", parents=parents)
    envs.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    actions = envs.add_subparsers(dest="envs_action")
    remove = actions.add_parser("remove", help="delete an engine's record (and the venv setup built for it)")
    remove.add_argument("engine", metavar="ENGINE")


# ------------------------------------------------------------------------------------------ progress


class Reporter:
    """Each step on stderr (rich when installed), download bars with bytes and rate; silent with -q."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.console: Any = None
        if not quiet:
            try:
                from rich.console import Console
            except ImportError:
                pass
            else:
                self.console = Console(stderr=True, highlight=False)

    def say(self, text: str) -> None:
        if self.quiet:
            return
        if self.console is not None:
            from rich.markup import escape

            self.console.print(escape(text), soft_wrap=True)
        else:
            print(text, file=sys.stderr)

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        started = time.monotonic()
        self.say(f"• {title}")
        yield
        self.say(f"  done in {time.monotonic() - started:.1f} s")

    @contextmanager
    def downloads(self) -> Iterator[Callable[[str], Any]]:
        """A factory of tqdm classes (huggingface_hub's ``tqdm_class``) that draw rich bars."""
        from huggingface_hub.utils.tqdm import tqdm as base

        if self.quiet or self.console is None:

            def quiet_bar(label: str) -> Any:
                class Quiet(base):
                    def __init__(self, *args: Any, **kwargs: Any) -> None:
                        kwargs.pop("name", None)
                        kwargs["disable"] = True
                        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

                return Quiet

            yield quiet_bar
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        progress = Progress(
            TextColumn("  {task.description:<28}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )

        def rich_bar(label: str) -> Any:
            class Bar(base):
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    kwargs.pop("name", None)
                    self._devnull = kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
                    super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
                    self._task = progress.add_task(label, total=self.total)

                def update(self, n: Union[float, None] = 1) -> Union[bool, None]:
                    shown: Union[bool, None] = super().update(n)
                    progress.update(self._task, completed=self.n, total=self.total)
                    return shown

                def close(self) -> None:
                    if hasattr(self, "_task"):
                        progress.update(self._task, completed=self.n, total=self.total)
                    super().close()
                    if hasattr(self, "_devnull"):
                        self._devnull.close()

            return Bar

        with progress:
            yield rich_bar


# ------------------------------------------------------------------------------------------ steps


def _adopted_checkpoints(python: str) -> Union[Path, None]:
    """``checkpoints/`` beside an adopted venv (upstream's layout: ``<checkout>/.venv``, ``<checkout>/checkpoints``)."""
    venv = Path(python).absolute().parent.parent
    candidate = venv.parent / "checkpoints"
    return candidate if (candidate / "config.yaml").is_file() else None


def _installed_version(python: str, distribution: str) -> Union[str, None]:
    code = f"import importlib.metadata as m\ntry: print(m.version({distribution!r}))\nexcept Exception: print('')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    return out.stdout.strip() or None


def _need_hub() -> None:
    """Downloads need huggingface_hub (the cli extra): say so instead of a traceback."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise SetupError(
            "downloading needs huggingface_hub: pip install 'indextts-sidecar[cli]' (or huggingface_hub), "
            "or pass --model-dir a directory that holds the checkpoints and hf_cache/"
        ) from None


def _check_model_dir(model_dir: Path, engine: str) -> None:
    from indextts_sidecar.engines.indextts import checkpoint_version

    if not model_dir.is_dir():
        raise SetupError(f"--model-dir {model_dir}: no such directory; give the folder that holds config.yaml")
    version = checkpoint_version(str(model_dir))
    wanted = _VERSION_OF[engine]
    if version is not None and version != wanted:
        other = _ENGINE_OF[version]
        raise SetupError(
            f"{model_dir} holds IndexTTS-{version} checkpoints, not IndexTTS-{wanted}: run "
            f"`indextts-client setup {other} --model-dir {model_dir}`, or give an IndexTTS-{wanted} directory"
        )


def _missing(model_dir: Path, engine: str, *, aux: bool) -> list[str]:
    from indextts_sidecar.engines.indextts import missing_checkpoints

    return missing_checkpoints(str(model_dir), version=_VERSION_OF[engine], qwen_emo=False, aux=aux)


def _voice_clip(folder: Path) -> str:
    """A one-second reference clip for the test synthesis (a tone: enough to run every stage)."""
    import wave

    import numpy as np

    rate = 22050
    t = np.arange(rate, dtype=np.float32) / rate
    samples = (0.3 * np.sin(2 * np.pi * 220.0 * t) * 32767).astype("<i2")
    path = folder / "setup-voice.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return str(path)


async def _verify(
    engine: str, python: str, model_dir: Path, options: dict[str, Any], reporter: Reporter
) -> tuple[str, dict[str, Any]]:
    """The doctor's checks, then one short synthesis on the device it found; returns (device, versions)."""
    from .._client import Client
    from .._doctor import run_doctor, with_engine_options
    from .._exceptions import SidecarError

    report = with_engine_options(await run_doctor(python, str(model_dir), engine=engine), options)
    problems = report.problems
    if not report.ran or problems:
        first = problems[0] if problems else None
        what = f"{first.what} (fix: {first.fix})" if first else "the doctor could not run"
        raise SetupError(f"the doctor found a problem: {what}; `indextts-client doctor --engine {engine}` tells more")
    device = "cuda" if report.torch.cuda_available else "mps" if report.torch.mps_available else "cpu"
    versions = {name: report.packages.get(name) for name in ("torch", "transformers", "indextts")}
    versions["indextts-sidecar"] = report.packages.get("indextts_sidecar")
    with tempfile.TemporaryDirectory() as folder:
        voice = _voice_clip(Path(folder))
        try:
            async with Client(
                engine,
                python=python,
                engine_options={"model_dir": str(model_dir), "device": device, **options},
                env={"HF_HUB_OFFLINE": "1"},
                ready_timeout=300,
            ) as client:
                # A bound on the audio: a model that never says "stop" (a random one) still ends.
                audio = await client.synthesize("Hello.", voice=voice, timeout=1800, max_mel_tokens=VERIFY_MEL_TOKENS)
        except SidecarError as exc:
            raise SetupError(f"the test synthesis on {device} failed: {exc}") from None
    if len(audio) == 0:
        raise SetupError(f"the test synthesis on {device} gave no audio: check `indextts-client doctor`")
    reporter.say(f"  {len(audio)} samples at {audio.sample_rate} Hz on {device}")
    return device, versions


def _setup(args: argparse.Namespace, reporter: Reporter) -> EnvRecord:
    engine: str = args.engine
    home = indextts_home()
    previous = read_record(engine)
    record = EnvRecord(engine=engine, python="", model_dir="", source=args.source)
    if previous is not None:
        record = msgspec.structs.replace(previous, status="incomplete", error=None, verified=False)
        write_record(record)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"setup-{engine}.log"

    uv = None if args.installer == "pip" else find_uv()
    if args.installer == "uv" and uv is None:
        raise SetupError("--installer uv: no uv binary found: pip install uv (the cli extra has it), or use pip")

    # 1. The venv.
    if args.python is not None:
        # Absolute, not resolved: a venv's python is a symlink to its base interpreter.
        python = os.path.abspath(shutil.which(args.python) or args.python)
        version = python_version(python)
        if version is None:
            raise SetupError(f"--python {args.python} does not run: give the interpreter of the venv to adopt")
        if version not in SUPPORTED_PYTHONS:
            raise SetupError(
                f"--python {args.python} is Python {version[0]}.{version[1]} and IndexTTS needs 3.10 or 3.11: "
                "adopt another venv, or leave --python out to build one"
            )
        record.source, record.venv = "adopted", None
        if args.force or _installed_version(python, "indextts-sidecar") != __version__:
            with reporter.step(f"installing indextts-sidecar {__version__} into {python}"):
                plan = InstallPlan(Path(python), [self_requirement()], "none", uv, log=log)
                if uv is None and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode:
                    raise SetupError(f"{python} has no pip and no uv was found: pip install uv, or add pip there")
                install(plan)
    else:
        venv = Path(args.venv).expanduser().absolute() if args.venv else home / "venvs" / engine
        if args.force and venv.exists():
            with reporter.step(f"removing {venv} (--force)"):
                shutil.rmtree(venv)
        torch = args.torch
        if torch == "auto":
            torch = "cuda" if detect_gpu() else "cpu"
        upstream, checkout = upstream_requirement(engine, args.source)
        with reporter.step(f"preparing the venv {venv} ({'uv' if uv else 'venv + pip'})"):
            python = str(create_venv(venv, args.base_python, uv, log))
        constraints = [Path(c).absolute() for c in args.constraint]
        if checkout is not None:
            lock = lock_constraints(checkout, uv, logs, log)
            if lock is not None:
                constraints.append(lock)
        with reporter.step(f"installing upstream ({args.source}), torch ({torch}) and indextts-sidecar {__version__}"):
            install(InstallPlan(Path(python), [upstream, self_requirement()], torch, uv, constraints, log=log))
        record.source = f"github@{upstream.rpartition('@')[2][:7]}" if args.source == "github" else args.source
        if checkout is not None:
            record.source = str(checkout)
        record.venv = str(venv)
        record.device = "cuda" if torch in ("cuda", "pypi") and detect_gpu() else "cpu"
    record.python = python
    write_record(record)

    # 2. The checkpoints.
    from ._hub import DEFAULT_MODELS, download_aux, download_model

    if args.model_dir is not None:
        model_dir = Path(args.model_dir).expanduser().absolute()
        _check_model_dir(model_dir, engine)
        record.model = None
    elif args.python is not None and args.model is None and _adopted_checkpoints(python) is not None:
        model_dir = _adopted_checkpoints(python)  # type: ignore[assignment]
        reporter.say(f"• found the checkpoints beside the venv: {model_dir}")
        _check_model_dir(model_dir, engine)
        record.model = None
    else:
        repo_id = args.model or DEFAULT_MODELS[engine]
        model_dir = home / "models" / repo_id.replace("/", "--")
        _need_hub()
        with reporter.step(f"downloading {repo_id} into {model_dir}"), reporter.downloads() as bar:
            download_model(repo_id, model_dir, bar)
        _check_model_dir(model_dir, engine)
        record.model = repo_id
    missing = _missing(model_dir, engine, aux=False)
    if missing:
        raise SetupError(
            f"{model_dir} lacks {', '.join(missing)}: give a complete IndexTTS-{_VERSION_OF[engine]} directory "
            "with --model-dir, or leave it out to download the checkpoints"
        )
    if _missing(model_dir, engine, aux=True):
        _need_hub()
        with reporter.step("downloading the auxiliary models into hf_cache/"), reporter.downloads() as bar:
            download_aux(model_dir, _VERSION_OF[engine], bar)
    record.model_dir = str(model_dir)
    record.engine_options = {}
    if engine == "indextts2" and args.source != "pypi" and not (model_dir / QWEN_EMO_DIR).is_dir():
        # Upstream IndexTTS-2 loads the Qwen emotion model unless told not to; without it, emotion
        # from text is refused and everything else works.
        record.engine_options["use_qwen_emo"] = False
        reporter.say(f"  no {QWEN_EMO_DIR}/ there: use_qwen_emo is off (no emotion from text)")
    write_record(record)

    # 3. Verify, then register as ready.
    if args.no_verify:
        record.versions = {"indextts-sidecar": _installed_version(python, "indextts-sidecar")}
    else:
        with reporter.step("verifying: the doctor, then one short synthesis"):
            record.device, record.versions = anyio.run(
                _verify, engine, python, model_dir, record.engine_options, reporter
            )
        record.verified = True
    record.status, record.error = "ready", None
    write_record(record)
    return record


def setup_command_main(args: argparse.Namespace) -> int:
    """Run ``setup``; a failure is one line on stderr (exit 1) and leaves the record incomplete."""
    reporter = Reporter(args.quiet)

    def interrupted(signum: int, frame: object) -> None:
        # Not KeyboardInterrupt: huggingface_hub's download threads are not daemons, and its
        # thread pool's exit would wait for a stalled one.  What is on disk stays: the next run
        # resumes the partial files.
        _mark_failed(args.engine, "interrupted")
        if sys.stderr.isatty():
            sys.stderr.write("\x1b[?25h")  # the cursor rich's live display hid
        print(
            "\nindextts-client setup: interrupted; run the same command again to resume (downloads continue "
            "where they stopped, a built venv is kept)",
            file=sys.stderr,
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(130)

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        record = _setup(args, reporter)
    except SetupError as exc:
        _mark_failed(args.engine, str(exc))
        print(f"indextts-client setup: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)
    engine = record.engine
    print(
        f"{engine} is ready: {record.python} with {record.model_dir}. Now: "
        f"`indextts-client say 'Hello.' --engine {engine} --voice REF.wav -o hello.wav`, "
        f"`indextts-client serve --engine {engine}`, `indextts-client doctor --engine {engine}`, "
        f'Client("{engine}") in Python'
    )
    return 0


def _mark_failed(engine: str, error: str) -> None:
    record = read_record(engine)
    if record is not None:
        write_record(msgspec.structs.replace(record, status="incomplete", error=error))


def envs_command(args: argparse.Namespace) -> int:
    if getattr(args, "envs_action", None) == "remove":
        record = read_record(args.engine)
        if not remove_record(args.engine):
            print(f"indextts-client envs: no environment registered for {args.engine}", file=sys.stderr)
            return 1
        if record is not None and record.venv:
            shutil.rmtree(record.venv, ignore_errors=True)
        kept = f"; the checkpoints stay in {record.model_dir}" if record is not None and record.model_dir else ""
        print(f"removed {args.engine}" + (f" and its venv {record.venv}" if record and record.venv else "") + kept)
        return 0
    records = list_records()
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(records) + b"\n")
        return 0
    if not records:
        print(f"no environments in {indextts_home()}: run `indextts-client setup indextts2`")
        return 0
    for r in records:
        where = f"python={r.python} model_dir={r.model_dir} source={r.source}"
        print(f"{r.engine:<12} {r.status:<10} {r.device:<5} {where}")
    return 0


def registered_for_doctor(engine: Union[str, None]) -> Union[EnvRecord, None]:
    """The record the doctor checks when given no --python: the engine's, or the first ready IndexTTS one."""
    names = (engine,) if engine in SETUP_ENGINES else SETUP_ENGINES if engine in (None, *INDEXTTS_ENGINES) else ()
    for name in names:
        record = read_record(name)
        if record is not None and record.ready:
            return record
    return None

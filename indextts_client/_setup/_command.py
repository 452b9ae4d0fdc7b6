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
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

import anyio
import msgspec

from indextts_sidecar import __version__

from .._doctor import QWEN_EMO_DIR
from .._exceptions import SidecarError
from .._registry import SETUP_ENGINES, EnvRecord, read_record, write_marker, write_record
from ._build import (
    InstallPlan,
    SetupError,
    create_venv,
    detect_gpu,
    find_uv,
    install,
    lock_constraints,
    self_requirement,
    venv_python,
)
from ._envs import add_envs_parser, envs_command, os_error, registered_for_doctor
from ._preflight import (
    VERSION_OF,
    Plan,
    check_checkpoints,
    missing,
    need_hub,
    offline,
    preflight,
    usable_home,
    works,
)

if TYPE_CHECKING:
    from .._audio import Audio

__all__ = [
    "OpenClient",
    "Speaker",
    "add_envs_parser",
    "add_setup_parser",
    "envs_command",
    "registered_for_doctor",
    "setup_command_main",
]

#: The test synthesis's cap on mel tokens (several seconds of audio; "Hello." needs about one).
VERIFY_MEL_TOKENS = 200


class Speaker(Protocol):
    """What the test synthesis asks of a started client (``Client`` is one)."""

    async def synthesize(
        self,
        text: str,
        *,
        voice: str,
        timeout: float,  # noqa: ASYNC109 (a request deadline, as Client's)
        max_mel_tokens: int,
    ) -> Audio: ...


#: Starts a client on an engine venv: ``Client`` itself, which the CLI passes in, so that setup
#: (run by the CLI) imports none of the client's layers, only the registry they read.
OpenClient = Callable[..., AbstractAsyncContextManager[Speaker]]


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


def _installed_version(python: str, distribution: str) -> Union[str, None]:
    code = f"import importlib.metadata as m\ntry: print(m.version({distribution!r}))\nexcept Exception: print('')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    return out.stdout.strip() or None


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
    engine: str, python: str, model_dir: Path, options: dict[str, Any], reporter: Reporter, open_client: OpenClient
) -> tuple[str, dict[str, Any]]:
    """The doctor's checks, then one short synthesis on the device it found; returns (device, versions)."""
    from .._doctor import run_doctor, with_engine_options

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
            async with open_client(
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


class _Run:
    """What a failure or a Ctrl-C must leave: ``kept`` is the ready record the run may not demote."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.kept: Union[EnvRecord, None] = None
        self.wanted: list[str] = []

    def save(self, record: EnvRecord) -> None:
        """Write a step's record, unless an older ready one stays until this run is ready too."""
        if self.kept is None:
            write_record(record)

    def failed(self, error: str) -> str:
        """Record the failure; returns the one line to print."""
        if self.kept is not None:
            kept = self.kept
            wanted = " and ".join(self.wanted) or "a repair"
            return (
                f"{error}; {self.engine} stays ready as it was ({kept.python} with {kept.model_dir}): "
                f"this run wanted {wanted}"
            )
        try:
            record = read_record(self.engine)
        except OSError:
            record = None
        if record is not None:
            write_record(msgspec.structs.replace(record, status="incomplete", error=error))
        return error


def _setup(args: argparse.Namespace, reporter: Reporter, run: _Run, open_client: OpenClient) -> EnvRecord:
    engine: str = args.engine
    home = usable_home()
    previous = read_record(engine)
    run.kept = previous if previous is not None and previous.ready else None
    uv = None if args.installer == "pip" else find_uv()
    if args.installer == "uv" and uv is None:
        raise SetupError("--installer uv: no uv binary found: pip install uv (the cli extra has it), or use pip")

    if previous is not None:
        record = msgspec.structs.replace(previous, status="incomplete", error=None, verified=False)
    else:
        record = EnvRecord(engine=engine, python="", model_dir="", source=args.source)
    run.save(record)  # incomplete from the first step (a failure then records its error)

    # 0. The cheap checks, before anything is installed or deleted.
    plan = preflight(args, home, uv, run.wanted)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"setup-{engine}.log"

    # 1. The venv.
    python = _venv(args, reporter, run, record, plan, uv, home, log)
    record.python = python
    run.save(record)

    # 2. The checkpoints.
    model_dir = _checkpoints(args, reporter, plan, record)
    run.save(record)

    # 3. Verify, then register as ready.
    _verify_and_register(args, reporter, run, record, python, model_dir, open_client)
    return record


def _venv(
    args: argparse.Namespace,
    reporter: Reporter,
    run: _Run,
    record: EnvRecord,
    plan: Plan,
    uv: Union[str, None],
    home: Path,
    log: Path,
) -> str:
    """Setup's first step: the venv adopted (this distribution installed into it) or built; its python."""
    if plan.adopt is not None:
        python = plan.adopt
        record.source, record.venv = "adopted", None
        if args.force or _installed_version(python, "indextts-sidecar") != __version__:
            with reporter.step(f"installing indextts-sidecar {__version__} into {python}"):
                install(InstallPlan(Path(python), [self_requirement()], "none", uv, log=log))
        return python
    venv = plan.venv
    assert venv is not None
    if plan.replace:
        if run.kept is not None and run.kept.venv and Path(run.kept.venv) == venv:
            run.kept = None  # the ready environment goes with its venv
            run.save(record)
        with reporter.step(f"removing {venv} (--force)" if args.force else f"removing {venv} (no working venv)"):
            shutil.rmtree(venv)
    fresh = not works(venv_python(venv))
    with reporter.step(f"preparing the venv {venv} ({'uv' if uv else 'venv + pip'})"):
        python = str(create_venv(venv, args.base_python, uv, log))
    if fresh:
        write_marker(venv, args.engine, home)
    constraints = [Path(c).absolute() for c in args.constraint]
    if plan.checkout is not None:
        lock = lock_constraints(plan.checkout, uv, log.parent, log, constraints)
        if lock is not None:
            constraints.append(lock)
    what = f"upstream ({args.source}), torch ({plan.torch}) and indextts-sidecar {__version__}"
    with reporter.step(f"installing {what}"):
        install(InstallPlan(Path(python), [plan.upstream, self_requirement()], plan.torch, uv, constraints, log=log))
    upstream = plan.upstream
    record.source = f"github@{upstream.rpartition('@')[2][:7]}" if args.source == "github" else args.source
    if plan.checkout is not None:
        record.source = str(plan.checkout)
    record.venv = str(venv)
    record.device = "cuda" if plan.torch in ("cuda", "pypi") and detect_gpu() else "cpu"
    return python


def _checkpoints(args: argparse.Namespace, reporter: Reporter, plan: Plan, record: EnvRecord) -> Path:
    """Setup's second step: the checkpoints and the auxiliary models, downloaded where missing."""
    from ._hub import download_aux, download_model

    engine: str = args.engine
    model_dir = plan.model_dir
    record.model = plan.repo_id
    if plan.repo_id is None:
        if args.model_dir is None:
            reporter.say(f"• found the checkpoints beside the venv: {model_dir}")
    elif not (offline() and not missing(model_dir, engine, aux=False)):
        with reporter.step(f"downloading {plan.repo_id} into {model_dir}"), reporter.downloads() as bar:
            download_model(plan.repo_id, model_dir, bar)
        check_checkpoints(model_dir, engine)
    if missing(model_dir, engine, aux=True):
        need_hub()
        with reporter.step("downloading the auxiliary models into hf_cache/"), reporter.downloads() as bar:
            download_aux(model_dir, VERSION_OF[engine], bar)
    record.model_dir = str(model_dir)
    record.engine_options = {}
    if engine == "indextts2" and args.source != "pypi" and not (model_dir / QWEN_EMO_DIR).is_dir():
        # Upstream IndexTTS-2 loads the Qwen emotion model unless told not to; without it, emotion
        # from text is refused and everything else works.
        record.engine_options["use_qwen_emo"] = False
        reporter.say(f"  no {QWEN_EMO_DIR}/ there: use_qwen_emo is off (no emotion from text)")
    return model_dir


def _verify_and_register(
    args: argparse.Namespace,
    reporter: Reporter,
    run: _Run,
    record: EnvRecord,
    python: str,
    model_dir: Path,
    open_client: OpenClient,
) -> None:
    """Setup's last step: verify, then register as ready.  Verifying the very environment
    registered as ready (its interpreter and checkpoints) judges it: a failure there demotes it,
    honestly."""
    kept = run.kept
    if kept is not None and (kept.python, kept.model_dir) == (python, str(model_dir)) and not args.no_verify:
        run.kept = None
        run.save(record)
    if args.no_verify:
        record.versions = {"indextts-sidecar": _installed_version(python, "indextts-sidecar")}
    else:
        with reporter.step("verifying: the doctor, then one short synthesis"):
            record.device, record.versions = anyio.run(
                _verify, args.engine, python, model_dir, record.engine_options, reporter, open_client
            )
        record.verified = True
    record.status, record.error = "ready", None
    write_record(record)
    run.kept = None


def setup_command_main(args: argparse.Namespace, open_client: OpenClient) -> int:
    """Run ``setup``; a failure is one line on stderr (exit 1), leaving the record incomplete, or an
    older ready one as it was.  ``open_client`` (``Client``) runs the test synthesis."""
    reporter = Reporter(args.quiet)
    run = _Run(args.engine)

    def interrupted(signum: int, frame: object) -> None:
        # Not KeyboardInterrupt: huggingface_hub's download threads are not daemons, and its
        # thread pool's exit would wait for a stalled one.  What is on disk stays: the next run
        # resumes the partial files.
        try:
            run.failed("interrupted")
        except (OSError, ValueError):
            pass
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
        record = _setup(args, reporter, run, open_client)
    except (SetupError, OSError) as exc:
        error = os_error(exc) if isinstance(exc, OSError) else str(exc)
        try:
            line = run.failed(error)
        except OSError:  # the registry itself cannot be written: the error alone
            line = error
        print(f"indextts-client setup: {line}", file=sys.stderr)
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

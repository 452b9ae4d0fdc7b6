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
from dataclasses import dataclass, field
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
    find_base_python,
    find_uv,
    install,
    lock_constraints,
    python_version,
    self_requirement,
    upstream_requirement,
    venv_python,
)
from ._registry import (
    INDEXTTS_ENGINES,
    SETUP_ENGINES,
    EnvRecord,
    home_problem,
    indextts_home,
    list_records,
    marker_problem,
    read_record,
    record_path,
    record_problem,
    remove_record,
    write_marker,
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


#: Free space a new venv needs under its folder: torch with the CUDA libraries (cuda, pypi on
#: Linux) is several GB, the CPU build under one; the rest of upstream's pins about 1 GB.
VENV_BYTES = {"cpu": 3 * 10**9, "cuda": 10 * 10**9, "pypi": 10 * 10**9, "none": 10**8}

_PROBE = (
    "import importlib.util, json, os, sys, sysconfig\n"
    "stdlib = sysconfig.get_path('stdlib') or ''\n"
    "print(json.dumps({'venv': sys.prefix != sys.base_prefix,"
    " 'conda': os.path.isdir(os.path.join(sys.prefix, 'conda-meta')),"
    " 'managed': os.path.isfile(os.path.join(stdlib, 'EXTERNALLY-MANAGED')),"
    " 'pip': importlib.util.find_spec('pip') is not None}))\n"
)


class _Interpreter(msgspec.Struct):
    venv: bool
    conda: bool
    managed: bool
    pip: bool


def _probe(python: str, given: str) -> _Interpreter:
    try:
        out = subprocess.run(
            [python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        return msgspec.json.decode(out.stdout.strip().splitlines()[-1], type=_Interpreter)
    except (OSError, subprocess.TimeoutExpired, IndexError, msgspec.MsgspecError):
        raise SetupError(f"--python {given} does not run: give the interpreter of the venv to adopt") from None


@dataclass
class _Plan:
    """What the run will do, settled by the cheap checks before anything is installed or deleted."""

    #: The interpreter to adopt (--python), or None to build ``venv``.
    adopt: Union[str, None] = None
    venv: Union[Path, None] = None
    #: Whether ``venv`` is replaced (--force, or a marked folder that is no working venv).
    replace: bool = False
    torch: str = "none"
    upstream: str = ""
    checkout: Union[Path, None] = None
    #: The checkpoints: a directory on disk, or a hub repository to fetch into ``model_dir``.
    model_dir: Path = Path()
    repo_id: Union[str, None] = None
    #: What the run asked for, in words (said when it fails and an older ready record stays).
    wanted: list[str] = field(default_factory=list)


def _home() -> Path:
    home = indextts_home()
    problem = home_problem(home)
    if problem is not None:
        raise SetupError(
            f"INDEXTTS_HOME {home} cannot hold the environments: {problem}; point INDEXTTS_HOME at a directory"
        )
    return home


def _free(where: Path) -> int:
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _works(python: Path) -> bool:
    return python.exists() and python_version(str(python)) in SUPPORTED_PYTHONS


def _check_target(venv: Path, home: Path, force: bool) -> bool:
    """Whether the venv folder is replaced; refuses a folder setup did not build (nothing deleted yet)."""
    if venv.is_symlink():
        raise SetupError(f"--venv {venv} is a symlink: give the folder itself")
    if venv.exists() and not venv.is_dir():
        raise SetupError(f"--venv {venv} is a file: give a new or empty folder")
    if not venv.exists() or not any(venv.iterdir()):
        return False
    works = (venv / "pyvenv.cfg").is_file() and _works(venv_python(venv))
    if works and not force:
        return False  # kept, repaired in place
    problem = marker_problem(venv, home)
    if problem is not None:
        why = "--force replaces only a venv setup built" if works else "it is not empty and not a working venv"
        raise SetupError(f"refusing to delete {venv}: {problem}, and {why}: remove it yourself or give another --venv")
    return True


def _check_checkpoints(model_dir: Path, engine: str) -> None:
    _check_model_dir(model_dir, engine)
    missing = _missing(model_dir, engine, aux=False)
    if missing:
        raise SetupError(
            f"{model_dir} lacks {', '.join(missing)}: give a complete IndexTTS-{_VERSION_OF[engine]} directory "
            "with --model-dir, or leave it out to download the checkpoints"
        )


def _preflight(args: argparse.Namespace, home: Path, uv: Union[str, None], wanted: list[str]) -> _Plan:
    """The cheap checks: the interpreter, the venv target, the disk, the checkpoints (or the hub id).

    ``wanted`` gathers what the run asks for as each is settled (said if it fails)."""
    engine: str = args.engine
    plan = _Plan(wanted=wanted)
    for constraint in args.constraint:
        if not Path(constraint).is_file():
            raise SetupError(f"--constraint {constraint}: no such file")
    if args.python is not None:
        # Absolute, not resolved: a venv's python is a symlink to its base interpreter.
        python = os.path.abspath(shutil.which(args.python) or args.python)
        plan.wanted.append(f"to adopt {python}")
        version = python_version(python)
        if version is None:
            raise SetupError(f"--python {args.python} does not run: give the interpreter of the venv to adopt")
        if version not in SUPPORTED_PYTHONS:
            raise SetupError(
                f"--python {args.python} is Python {version[0]}.{version[1]} and IndexTTS needs 3.10 or 3.11: "
                "adopt another venv, or leave --python out to build one"
            )
        found = _probe(python, args.python)
        if not (found.venv or found.conda):
            kind = "an externally managed system Python" if found.managed else "not a venv's interpreter"
            raise SetupError(
                f"--python {args.python} is {kind}; setup installs into the venv it adopts: make one "
                f"(`{python} -m venv DIR`) and give DIR/bin/python, or leave --python out to build one"
            )
        if uv is None and not found.pip:
            raise SetupError(
                f"--python {args.python}: that venv has no pip and no uv was found: pip install uv, or add pip there"
            )
        plan.adopt = python
    else:
        plan.venv = Path(args.venv).expanduser().absolute() if args.venv else home / "venvs" / engine
        plan.torch = args.torch if args.torch != "auto" else "cuda" if detect_gpu() else "cpu"
        plan.wanted.append(f"a venv in {plan.venv} from --source {args.source} with torch {plan.torch}")
        plan.replace = _check_target(plan.venv, home, args.force)
        plan.upstream, plan.checkout = upstream_requirement(engine, args.source)
        if uv is None or args.base_python is not None:
            find_base_python(args.base_python)
        if plan.replace or not _works(venv_python(plan.venv)):
            needed, free = VENV_BYTES[plan.torch], _free(plan.venv)
            if needed > free:
                raise SetupError(
                    f"the disk under {plan.venv} has {free / 1e9:.1f} GB free and the venv needs about "
                    f"{needed / 1e9:.0f} GB (torch {plan.torch}): free space there, or build it elsewhere (--venv DIR)"
                )
    if args.model_dir is not None:
        plan.model_dir = Path(args.model_dir).expanduser().absolute()
        plan.wanted.append(f"the checkpoints in {plan.model_dir}")
        _check_checkpoints(plan.model_dir, engine)
    elif plan.adopt is not None and args.model is None and _adopted_checkpoints(plan.adopt) is not None:
        plan.model_dir = _adopted_checkpoints(plan.adopt)  # type: ignore[assignment]
        plan.wanted.append(f"the checkpoints beside the venv, {plan.model_dir}")
        _check_checkpoints(plan.model_dir, engine)
    else:
        from ._hub import DEFAULT_MODELS, check_model

        plan.repo_id = args.model or DEFAULT_MODELS[engine]
        plan.model_dir = home / "models" / plan.repo_id.replace("/", "--")
        plan.wanted.append(f"the checkpoints of {plan.repo_id} from the hub (no --model-dir)")
        if _missing(plan.model_dir, engine, aux=False) or not _offline():
            _need_hub()
            check_model(plan.repo_id, plan.model_dir)
    if _missing(plan.model_dir, engine, aux=True) and _offline():
        raise SetupError(
            f"HF_HUB_OFFLINE is set and the auxiliary models are not in {plan.model_dir / 'hf_cache'}: "
            "unset HF_HUB_OFFLINE, or copy a filled hf_cache/ there"
        )
    return plan


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


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
            wanted = "; ".join(self.wanted) or "a repair"
            return (
                f"{error}; {self.engine} stays ready as it was ({kept.python} with {kept.model_dir}), "
                f"and this run, which wanted {wanted}, changed nothing registered"
            )
        try:
            record = read_record(self.engine)
        except OSError:
            record = None
        if record is not None:
            write_record(msgspec.structs.replace(record, status="incomplete", error=error))
        return error


def _setup(args: argparse.Namespace, reporter: Reporter, run: _Run) -> EnvRecord:
    engine: str = args.engine
    home = _home()
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
    plan = _preflight(args, home, uv, run.wanted)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"setup-{engine}.log"

    # 1. The venv.
    if plan.adopt is not None:
        python = plan.adopt
        record.source, record.venv = "adopted", None
        if args.force or _installed_version(python, "indextts-sidecar") != __version__:
            with reporter.step(f"installing indextts-sidecar {__version__} into {python}"):
                install(InstallPlan(Path(python), [self_requirement()], "none", uv, log=log))
    else:
        venv = plan.venv
        assert venv is not None
        if plan.replace:
            if run.kept is not None and run.kept.venv and Path(run.kept.venv) == venv:
                run.kept = None  # the ready environment goes with its venv
                run.save(record)
            with reporter.step(f"removing {venv} (--force)" if args.force else f"removing {venv} (no working venv)"):
                shutil.rmtree(venv)
        fresh = not _works(venv_python(venv))
        with reporter.step(f"preparing the venv {venv} ({'uv' if uv else 'venv + pip'})"):
            python = str(create_venv(venv, args.base_python, uv, log))
        if fresh:
            write_marker(venv, engine, home)
        constraints = [Path(c).absolute() for c in args.constraint]
        if plan.checkout is not None:
            lock = lock_constraints(plan.checkout, uv, logs, log)
            if lock is not None:
                constraints.append(lock)
        what = f"upstream ({args.source}), torch ({plan.torch}) and indextts-sidecar {__version__}"
        with reporter.step(f"installing {what}"):
            install(
                InstallPlan(Path(python), [plan.upstream, self_requirement()], plan.torch, uv, constraints, log=log)
            )
        upstream = plan.upstream
        record.source = f"github@{upstream.rpartition('@')[2][:7]}" if args.source == "github" else args.source
        if plan.checkout is not None:
            record.source = str(plan.checkout)
        record.venv = str(venv)
        record.device = "cuda" if plan.torch in ("cuda", "pypi") and detect_gpu() else "cpu"
    record.python = python
    run.save(record)

    # 2. The checkpoints.
    from ._hub import download_aux, download_model

    model_dir = plan.model_dir
    record.model = plan.repo_id
    if plan.repo_id is None:
        if args.model_dir is None:
            reporter.say(f"• found the checkpoints beside the venv: {model_dir}")
    elif not (_offline() and not _missing(model_dir, engine, aux=False)):
        with reporter.step(f"downloading {plan.repo_id} into {model_dir}"), reporter.downloads() as bar:
            download_model(plan.repo_id, model_dir, bar)
        _check_checkpoints(model_dir, engine)
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
    run.save(record)

    # 3. Verify, then register as ready.  Verifying the very environment registered as ready
    # (its interpreter and checkpoints) judges it: a failure there demotes it, honestly.
    kept = run.kept
    if kept is not None and (kept.python, kept.model_dir) == (python, str(model_dir)) and not args.no_verify:
        run.kept = None
        run.save(record)
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
    run.kept = None
    return record


def setup_command_main(args: argparse.Namespace) -> int:
    """Run ``setup``; a failure is one line on stderr (exit 1), leaving the record incomplete, or an
    older ready one as it was."""
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
        record = _setup(args, reporter, run)
    except SetupError as exc:
        try:
            line = run.failed(str(exc))
        except OSError:
            line = str(exc)
        print(f"indextts-client setup: {line}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"indextts-client setup: {run.failed(_os_error(exc))}", file=sys.stderr)
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


def _os_error(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot use{where}: {exc.strerror or exc}"


def envs_command(args: argparse.Namespace) -> int:
    home = indextts_home()
    problem = home_problem(home)
    if problem is not None:
        print(f"indextts-client envs: INDEXTTS_HOME {home} cannot be used: {problem}", file=sys.stderr)
        return 1
    if getattr(args, "envs_action", None) == "remove":
        return _remove(args.engine, home)
    records = list_records()
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(records) + b"\n")
        return 0
    if not records:
        print(f"no environments in {home}: run `indextts-client setup indextts2`")
        return 0
    for r in records:
        where = f"python={r.python} model_dir={r.model_dir} source={r.source}"
        print(f"{r.engine:<12} {r.status:<10} {r.device:<5} {where}")
    return 0


def _remove(engine: str, home: Path) -> int:
    """``envs remove ENGINE``: the record, and the venv only where setup built it (its marker)."""
    if engine not in SETUP_ENGINES:
        print(f"indextts-client envs: ENGINE is one of {', '.join(SETUP_ENGINES)}, not {engine!r}", file=sys.stderr)
        return 2
    path = record_path(engine, home)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        print(f"indextts-client envs: no environment registered for {engine}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"indextts-client envs: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        record: Union[EnvRecord, None] = msgspec.json.decode(data, type=EnvRecord)
        invalid = record_problem(record, engine)  # type: ignore[arg-type]
    except msgspec.MsgspecError as exc:
        record, invalid = None, f"it does not decode ({exc})"
    remove_record(engine, home)
    if record is None or invalid is not None:
        print(
            f"indextts-client envs: removed the record of {engine}, which was not valid ({invalid}); "
            "no folder was deleted",
            file=sys.stderr,
        )
        return 1
    kept = f"; the checkpoints stay in {record.model_dir}" if record.model_dir else ""
    if record.venv:
        venv = Path(record.venv)
        refused = marker_problem(venv, home) if venv.exists() or venv.is_symlink() else None
        if refused is not None:
            print(f"indextts-client envs: removed the record of {engine} but kept {venv}: {refused}", file=sys.stderr)
            return 1
        if venv.exists():
            try:
                shutil.rmtree(venv)
            except OSError as exc:
                print(f"indextts-client envs: removed the record of {engine}; {_os_error(exc)}", file=sys.stderr)
                return 1
    print(f"removed {engine}" + (f" and its venv {record.venv}" if record.venv else "") + kept)
    return 0


def registered_for_doctor(engine: Union[str, None]) -> Union[EnvRecord, None]:
    """The record the doctor checks when given no --python: the engine's, or the first ready IndexTTS one."""
    names = (engine,) if engine in SETUP_ENGINES else SETUP_ENGINES if engine in (None, *INDEXTTS_ENGINES) else ()
    for name in names:
        record = read_record(name)
        if record is not None and record.ready:
            return record
    return None

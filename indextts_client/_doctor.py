"""``indextts-client doctor``: check an engine venv from the parent's side.

:func:`run_doctor` runs ``PYTHON -m indextts_sidecar --doctor`` in the engine's venv and
decodes its JSON report; :func:`render` prints it as a table; :func:`exit_code` says
whether anything blocks synthesis.  A doctor that cannot run at all (no such interpreter,
indextts-sidecar missing from that venv, a crash, a hang) still yields a report, with
``ran`` false and the reason under ``problems``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO, Union

import anyio
import msgspec

from indextts_sidecar.protocol.doctor import DoctorReport, Problem, is_indextts

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "QWEN_EMO_DIR",
    "DoctorReport",
    "Problem",
    "doctor_command",
    "exit_code",
    "render",
    "run_doctor",
    "with_engine_options",
]

#: Seconds the doctor may take: it imports torch and indextts, which is slow on a cold disk.
DEFAULT_TIME_LIMIT = 180.0
#: Exit codes of :func:`exit_code`.
EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_NOT_RUN = 2

_STDERR_TAIL = 2000


def _install_hint(python: str) -> str:
    """The install command for a venv: the package is not on the package index yet."""
    return f"{python} -m pip install -e /path/to/indextts-sidecar (the folder of a clone of its repository)"


def _not_run(what: str, fix: str) -> DoctorReport:
    return DoctorReport(ran=False, problems=[Problem(what=what, fix=fix)])


def _tail(data: Union[bytes, None]) -> str:
    text = (data or b"").decode("utf-8", "replace").strip()
    return text[-_STDERR_TAIL:]


async def run_doctor(
    python: str,
    model_dir: Union[str, None],
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
    env: Union[Mapping[str, str], None] = None,
    engine: Union[str, None] = None,
) -> DoctorReport:
    """Run the doctor with the interpreter ``python`` and return its report.

    ``engine`` names the engine to check (None: IndexTTS, whichever flavour is installed).
    ``env`` replaces the child's environment (default: this process's).  Never raises for
    a doctor that fails: the report says what went wrong.
    """
    command = [python, "-m", "indextts_sidecar", "--doctor"]
    if model_dir is not None:
        command += ["--model-dir", model_dir]
    if engine is not None:
        command += ["--engine", engine]
    try:
        with anyio.fail_after(time_limit):
            result = await anyio.run_process(
                command, stdin=subprocess.DEVNULL, check=False, env=dict(env) if env is not None else None
            )
    except TimeoutError:
        return _not_run(
            f"the doctor did not finish within {time_limit:g} s",
            "run `PYTHON -m indextts_sidecar --doctor` by hand to see where it hangs (a slow disk or a GPU driver)",
        )
    except OSError as exc:
        return _not_run(
            f"cannot run {python}: {exc}",
            "pass --python the engine venv's interpreter, e.g. /path/to/engine-venv/bin/python",
        )
    stderr = _tail(result.stderr)
    if result.returncode != 0:
        if "No module named indextts_sidecar" in stderr:
            fix = f"install indextts-sidecar into that venv: {_install_hint(python)}"
        elif "unrecognized arguments: --doctor" in stderr:
            fix = f"upgrade indextts-sidecar in that venv from an up-to-date clone: {_install_hint(python)}"
        else:
            fix = "see the error above; run the command by hand for the full output"
        return _not_run(f"the doctor exited with code {result.returncode}: {stderr or '(no stderr)'}", fix)
    lines = [line for line in (result.stdout or b"").splitlines() if line.startswith(b"{")]
    if not lines:
        return _not_run(f"the doctor printed no report; stderr: {stderr or '(empty)'}", "report this as a bug")
    try:
        return msgspec.json.decode(lines[-1], type=DoctorReport)
    except msgspec.MsgspecError as exc:
        return _not_run(
            f"the doctor's report does not decode: {exc}", "use the same indextts-sidecar version in both venvs"
        )


#: The folder of IndexTTS-2's Qwen emotion model, which ``use_qwen_emo: false`` does without.
QWEN_EMO_DIR = "qwen0.6bemo4-merge"


def with_engine_options(report: DoctorReport, engine_options: Mapping[str, object]) -> DoctorReport:
    """The report as it bears on an engine run with ``engine_options``: the doctor judges
    upstream's defaults, so with ``use_qwen_emo: false`` (setup's record for a checkpoint
    directory without the Qwen model) a missing Qwen folder is a warning, not a problem."""
    if engine_options.get("use_qwen_emo") is not False:
        return report
    qwen = [p for p in report.problems if QWEN_EMO_DIR in p.what]
    if not qwen or report.checkpoints.missing != [f"{QWEN_EMO_DIR}/"]:  # something else missing too
        return report
    problems = [p for p in report.problems if p not in qwen]
    warnings = [
        *report.warnings,
        *(
            msgspec.structs.replace(
                p, fix=f"{p.fix}; this environment runs with use_qwen_emo=false, so emotion from text is unavailable"
            )
            for p in qwen
        ),
    ]
    return msgspec.structs.replace(report, problems=problems, warnings=warnings, ok=report.ok or not problems)


def exit_code(report: DoctorReport) -> int:
    """0 when nothing blocks synthesis, 1 when something does, 2 when the doctor could not run."""
    if not report.ran:
        return EXIT_NOT_RUN
    return EXIT_PROBLEMS if report.problems else EXIT_OK


#: Rows of the report: (check, status, details); status is ok, warning, problem or unknown.
Row = tuple[str, str, str]


def _rows(report: DoctorReport) -> list[Row]:
    """The report's table, as plain strings (rendered with rich or as plain text)."""
    if not report.ran:
        return []
    py = report.python
    rows: list[Row] = [
        ("python", "ok", f"{py.implementation} {py.version} ({py.executable})"),
        ("indextts-sidecar", "ok", str(report.packages.get("indextts_sidecar"))),
    ]
    engine = report.engine_info
    if engine is not None and not is_indextts(report.engine):
        detail = engine.description if engine.available else engine.problem or "not available"
        rows.append((f"engine {engine.name}", "ok" if engine.available else "problem", detail))
        return rows
    torch = report.torch
    if torch.importable:
        rows.append(
            ("torch", "ok", f"{torch.version}" + (f" (CUDA {torch.cuda_version})" if torch.cuda_version else ""))
        )
    else:
        rows.append(("torch", "problem", torch.error or "not importable"))
    devices = [*torch.cuda_devices]
    if torch.mps_available:
        devices.append("Apple MPS")
    if torch.xpu_available:
        devices.append("Intel XPU")
    if devices:
        rows.append(("accelerator", "ok", ", ".join(devices)))
    elif torch.importable:
        rows.append(("accelerator", "warning", "none: CPU only"))
    else:
        rows.append(("accelerator", "unknown", "needs torch"))
    tf = report.transformers
    tf_blocks = tf.status == "conflict" or (tf.status == "missing" and report.indextts.found)
    tf_status = "problem" if tf_blocks else "ok" if tf.status == "ok" else "warning"
    rows.append(("transformers", tf_status, f"{tf.version or 'not installed'} ({tf.status}; upstream pins {tf.pin})"))
    tts = report.indextts
    if tts.imports:
        rows.append(
            ("indextts", "ok", f"{tts.label} {tts.version or ''} at {tts.location}; run it with --engine {tts.engine}")
        )
    elif tts.found:
        rows.append(("indextts", "problem", tts.error or "does not import"))
    else:
        rows.append(("indextts", "problem", "not installed"))
    ck = report.checkpoints
    if not ck.checked:
        rows.append(("checkpoints", "warning", "not checked (pass --model-dir)"))
    elif not ck.exists:
        rows.append(("checkpoints", "problem", f"{ck.model_dir} does not exist"))
    elif ck.missing or ck.aux_missing:
        # As the list below says: a problem only where one of the report's problems is about them
        # (use_qwen_emo=false makes a missing Qwen folder a warning, see with_engine_options).
        blocking = any(str(ck.model_dir) in p.what for p in report.problems)
        absent = ", ".join([*ck.missing, *ck.aux_missing])
        rows.append(("checkpoints", "problem" if blocking else "warning", f"{ck.model_dir}: missing {absent}"))
    else:
        extra = f"; optional, absent: {', '.join(ck.optional_missing)}" if ck.optional_missing else ""
        rows.append(("checkpoints", "ok", f"{ck.model_dir}: all {len(ck.present)} present{extra}"))
    return rows


def _verdict(report: DoctorReport) -> tuple[str, str]:
    """The last line and its colour."""
    if not report.ran:
        return "the doctor could not run", "red"
    if report.problems:
        count = len(report.problems)
        return f"{count} problem{'s' if count > 1 else ''} block{'' if count > 1 else 's'} synthesis", "red"
    return "ready to synthesize", "green"


def render(report: DoctorReport, console: Console) -> None:
    """Print ``report`` as a rich table, then its problems and warnings with what to do."""
    from rich.markup import escape
    from rich.table import Table

    styles = {"ok": "[green]ok[/]", "warning": "[yellow]warning[/]", "problem": "[red]problem[/]"}
    rows = _rows(report)
    if rows:
        table = Table(title=f"indextts-sidecar doctor: {escape(report.python.executable)}", show_lines=False)
        table.add_column("check", style="bold")
        table.add_column("status")
        table.add_column("details", overflow="fold")
        for check, status, detail in rows:
            table.add_row(escape(check), styles.get(status, f"[dim]{status}[/]"), escape(detail))
        console.print(table)
    # soft_wrap: a fix is often a command to paste; rich must not break it across lines.
    for problem in report.problems:
        console.print(
            f"[red]problem:[/] {escape(problem.what)}\n    [bold]fix:[/] {escape(problem.fix)}", soft_wrap=True
        )
    for warning in report.warnings:
        console.print(
            f"[yellow]warning:[/] {escape(warning.what)}\n    [bold]fix:[/] {escape(warning.fix)}", soft_wrap=True
        )
    verdict, colour = _verdict(report)
    console.print(f"[{colour}]{verdict}[/]")


def render_plain(report: DoctorReport, out: TextIO) -> None:
    """As :func:`render`, as plain text (for a venv without rich, or output that is not a terminal)."""
    rows = _rows(report)
    if rows:
        print(f"indextts-sidecar doctor: {report.python.executable}", file=out)
        width = max(len(check) for check, _, _ in rows)
        for check, status, detail in rows:
            print(f"  {check:<{width}}  {status:<8} {detail}", file=out)
    for kind, items in (("problem", report.problems), ("warning", report.warnings)):
        for item in items:
            print(f"{kind}: {item.what}\n    fix: {item.fix}", file=out)
    print(_verdict(report)[0], file=out)


def doctor_command(
    python: str,
    model_dir: Union[str, None],
    engine: Union[str, None] = None,
    engine_options: Union[Mapping[str, object], None] = None,
) -> int:
    """``indextts-client doctor --python PATH [--model-dir DIR] [--engine NAME]``: run, print, return the exit code.

    A rich table when rich is installed, plain text otherwise.  ``engine_options``: those the
    engine runs with (a registered environment's), see :func:`with_engine_options`.
    """
    report = anyio.run(lambda: run_doctor(python, model_dir, engine=engine))
    report = with_engine_options(report, engine_options or {})
    try:
        from rich.console import Console
    except ImportError:
        render_plain(report, sys.stdout)
    else:
        render(report, Console())
    return exit_code(report)

"""Another checkout of this project beside this one: the one way the bench scripts compare a change.

``bench_ab.py`` (per-request cost), ``bench_spawn.py`` (spawn to the first answer) and
``bench_trace.py`` (where a request's time goes) all take ``--before CHECKOUT`` (a git
worktree of the commit to compare with) through :func:`add_before`, and run that checkout's
client and sidecar as one more contender, taking turns with this checkout's, with
:func:`checkout_env` and the checkout as the working directory so that its packages, not
this one's, are imported.  :func:`compile_checkouts` compiles both checkouts' bytecode
first: a fresh worktree has none, and a shell with PYTHONDONTWRITEBYTECODE set never writes
it, so every spawn would compile the modules again (some 20 ms here).
"""

from __future__ import annotations

import argparse
import compileall
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PACKAGES = ("indextts_sidecar", "indextts_client")


def add_before(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--before",
        required=required,
        type=os.path.abspath,
        help="another checkout of this project (a git worktree) to run beside this one",
    )


def checkout_env(repo: str) -> dict[str, str]:
    """This environment, with ``repo``'s packages first on the import path."""
    return {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}


def compile_checkouts(*repos: str) -> None:
    for repo in repos:
        for package in PACKAGES:
            compileall.compile_dir(os.path.join(repo, package), quiet=1)

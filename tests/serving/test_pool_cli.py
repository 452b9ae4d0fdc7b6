"""The pool's options are defined once (``indextts_client._pool._cli``) and read the same by both servers."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from indextts_client._pool._cli import add_pool_arguments, pool_kwargs

POOL_FLAGS = ("--engine", "--size", "--devices", "--python", "--option", "--max-outstanding", "--pool-timeout")


def _help(*command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "indextts_client", *command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_serve_and_wyoming_offer_the_same_pool_options() -> None:
    serve, wyoming = _help("serve"), _help("wyoming")
    for flag in POOL_FLAGS:
        assert flag in serve and flag in wyoming, flag
    # Python 3.13's argparse writes "-O, --option KEY=VALUE", older ones "-O KEY=VALUE, --option KEY=VALUE".
    for text in (serve, wyoming):
        assert re.search(r"-O( KEY=VALUE)?, --option KEY=VALUE", text), text


def test_pool_kwargs_from_the_options() -> None:
    parser = argparse.ArgumentParser()
    add_pool_arguments(parser)
    args = parser.parse_args(["--engine", "fake", "--devices", "cuda:0,cuda:1", "-O", "sample_rate=16000"])
    assert pool_kwargs(args, parser) == {
        "engine_options": {"sample_rate": 16000},
        "max_outstanding": 4,
        "pool_timeout": 30.0,
        "devices": ["cuda:0", "cuda:1"],
    }
    args = parser.parse_args(["--size", "2", "--python", "/usr/bin/python3"])
    assert pool_kwargs(args, parser) == {
        "engine_options": {},
        "max_outstanding": 4,
        "pool_timeout": 30.0,
        "size": 2,
        "python": "/usr/bin/python3",
    }
    with pytest.raises(SystemExit):
        pool_kwargs(parser.parse_args(["-O", "novalue"]), parser)
    with pytest.raises(SystemExit):
        pool_kwargs(parser.parse_args(["--size", "0"]), parser)


@pytest.mark.parametrize("command", ["serve", "wyoming"])
def test_help_gives_each_default_once(command: str) -> None:
    text = re.sub(r"\s+", " ", _help(command))
    assert "(default 1)" in text  # --size and --per-device say theirs in their help
    assert not re.search(r"\(default[: ][^)]*\) \(default", text), text
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text


@pytest.mark.parametrize(
    ("command", "arguments", "error"),
    [
        ("serve", ["--port", "x"], "argument --port: 'x' is not a port number"),
        ("serve", ["--bogus"], "unrecognized arguments: --bogus"),
        ("wyoming", ["--uri", "tcp://127.0.0.1:0", "--size", "two"], "argument --size: invalid int value: 'two'"),
    ],
)
def test_an_argument_error_is_one_line_with_a_pointer_to_help(command: str, arguments: list[str], error: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "indextts_client", command, *arguments], capture_output=True, text=True, timeout=60
    )
    prog = f"indextts-client {command}"
    assert done.returncode == 2
    assert done.stderr == f"{prog}: error: {error} (see {prog} --help)\n"

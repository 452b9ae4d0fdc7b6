"""The pool's command-line options, defined once for every server that runs a pool
(``indextts-client serve`` and ``indextts-client wyoming``)."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from indextts_sidecar.protocol.options import parse_options

from .._defaults import DEFAULT_MAX_OUTSTANDING, DEFAULT_PER_DEVICE, DEFAULT_POOL_SIZE, DEFAULT_POOL_TIMEOUT

__all__ = ["DefaultsFormatter", "ServerParser", "add_pool_arguments", "pool_kwargs"]


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, once: not where the help says it already, nor for
    a default that is no value (None, an off flag, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default == [] or default == argparse.SUPPRESS:
            return text
        return str(super()._get_help_string(action))


class ServerParser(argparse.ArgumentParser):
    """A server's parser: an argument error is one line and a pointer to ``--help``, not the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """The pool options: engine, size or devices, interpreter, engine options, queue bounds."""
    parser.add_argument("--engine", default="espeak", help="engine name (default: espeak)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--size", type=int, help=f"sidecars (default {DEFAULT_POOL_SIZE})")
    group.add_argument("--devices", help="one sidecar per device: cuda:0,cuda:1")
    parser.add_argument(
        "--per-device",
        type=int,
        default=DEFAULT_PER_DEVICE,
        metavar="N",
        help=f"with --devices: N sidecars on each device (default {DEFAULT_PER_DEVICE})",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="share each GPU between its sidecars through a private NVIDIA MPS daemon (needs the NVIDIA driver)",
    )
    parser.add_argument("--python", help="the engine venv's interpreter")
    parser.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE", help="engine option")
    parser.add_argument(
        "--max-outstanding", type=int, default=DEFAULT_MAX_OUTSTANDING, help="requests in flight per sidecar"
    )
    parser.add_argument(
        "--pool-timeout", type=float, default=DEFAULT_POOL_TIMEOUT, help="seconds a request waits for room"
    )


def pool_kwargs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The keyword arguments of ``Pool(args.engine, ...)`` from the options above; a bad one is the parser's error."""
    try:
        engine_options = parse_options(args.option)
    except ValueError as exc:
        parser.error(f"--option: {exc}")
    if args.size is not None and args.size < 1:
        parser.error("--size must be >= 1")
    if args.per_device < 1:
        parser.error("--per-device must be >= 1")
    if args.per_device > 1 and not args.devices:
        parser.error("--per-device needs --devices (several sidecars without devices: --size)")
    kwargs: dict[str, Any] = {
        "engine_options": engine_options,
        "max_outstanding": args.max_outstanding,
        "pool_timeout": args.pool_timeout,
    }
    if args.devices:
        kwargs["devices"] = [d for d in args.devices.split(",") if d]
        if args.per_device > 1:
            kwargs["per_device"] = args.per_device
    else:
        kwargs["size"] = args.size or DEFAULT_POOL_SIZE
    if args.mps:
        kwargs["mps"] = True
    if args.python:
        kwargs["python"] = args.python
    return kwargs

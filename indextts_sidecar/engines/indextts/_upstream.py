"""Living with upstream's code in this process: its imports, its environment, its signatures, its prints.

Upstream changes process-wide state when imported (warning filters, ``HF_HUB_CACHE``),
reaches the network unless told not to, differs in signature from one flavour to the
next, and prints its stage times to stdout.  Everything here guards against or reads
those without patching upstream.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Union

log = logging.getLogger("indextts_sidecar.engines.indextts")

__all__ = [
    "StageTimes",
    "accelerated",
    "default_of",
    "device_memory",
    "empty_caches",
    "named_parameters",
    "offline",
    "openmp_waits",
    "preserved_process_state",
    "takes_var_keyword",
]


def accelerated(model: Any) -> bool:
    """Whether upstream's GPT runs on its accel engine (``use_accel`` on CUDA)."""
    return getattr(getattr(model, "gpt", None), "accel_engine", None) is not None


#: How long (in spins, a few microseconds) an idle OpenMP thread of torch's waits for work before
#: it sleeps: GNU libgomp, which torch's Linux wheels use, spins 300,000 times by default.
OPENMP_SPINCOUNT = "1000"
#: The environment variables that say how OpenMP threads wait; a user's own are left alone.
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def openmp_waits() -> dict[str, str]:
    """Bound the spinning of torch's OpenMP threads before torch is imported; what is in effect.

    An OpenMP thread that waits for its team spins before it sleeps.  On a CPU whose cores are
    busy with anything else (the parent app, a second sidecar, a test suite), a team's thread
    spins while its partner waits for a core, at every one of the thousands of parallel regions
    of a request: a tiny IndexTTS-2 request on 2 cores took 0.49 s quiet and 34 s with one core
    busy (``bench/bench_openmp_wait.py``); with ``GOMP_SPINCOUNT=1000``, 0.57 s (0.50-0.64) quiet
    and 1.0 s so.  libgomp reads these variables when torch loads it, so this must run first; a
    variable the user set (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``) wins.
    """
    if "torch" not in sys.modules and not any(name in os.environ for name in OPENMP_WAIT_VARIABLES):
        os.environ["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    return {name: os.environ[name] for name in OPENMP_WAIT_VARIABLES if name in os.environ}


@contextmanager
def preserved_process_state() -> Iterator[None]:
    """Import upstream without letting it change this process for good.

    Upstream's modules install warning filters and (2.5) set ``HF_HUB_CACHE`` to
    ``./checkpoints/hf_cache``, relative to whatever the working directory is.
    huggingface_hub reads that variable once, when first imported, so it is imported
    first, under the environment the sidecar was given; both are restored afterwards.
    """
    with contextlib.suppress(ImportError):
        importlib.import_module("huggingface_hub")
    filters = list(warnings.filters)
    try:
        with _restored_environ("HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
            yield
    finally:
        warnings.filters[:] = filters  # type: ignore[index]
        warnings._filters_mutated()  # type: ignore[attr-defined]


@contextmanager
def offline(enabled: bool) -> Iterator[None]:
    """While constructing: tell Hugging Face libraries not to reach the network (if ``enabled``)."""
    if not enabled:
        yield
        return
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    with _restored_environ(*names):
        os.environ.update(dict.fromkeys(names, "1"))
        yield


@contextmanager
def _restored_environ(*names: str) -> Iterator[None]:
    """Put the environment variables ``names`` back as they were (set or unset) on leaving."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Signature introspection: which keywords the installed flavour's constructor and ``infer`` take.


def _signature(fn: Any) -> Union[inspect.Signature, None]:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def named_parameters(fn: Any) -> frozenset[str]:
    sig = _signature(fn)
    if sig is None:
        return frozenset()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(name for name, p in sig.parameters.items() if p.kind in kinds)


def takes_var_keyword(fn: Any) -> bool:
    sig = _signature(fn)
    return sig is not None and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def default_of(fn: Any, name: str) -> Any:
    sig = _signature(fn)
    if sig is None or name not in sig.parameters:
        return None
    default = sig.parameters[name].default
    return None if default is inspect.Parameter.empty else default


#: The stage times upstream prints after each inference (``>> gpt_gen_time: 1.23 seconds``).
_STAGE_LINE = re.compile(r">> (gpt_gen|gpt_forward|s2mel|bigvgan)_time: ([0-9]+(?:\.[0-9]+)?) seconds")


class StageTimes:
    """``sys.stdout`` while upstream runs a step: every write goes on to the stdout it replaced,
    and the stage times upstream prints are kept (seconds, to upstream's two decimals).  How
    the adapter reports upstream's GPT, s2mel and vocoder times without patching upstream."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._partial = ""
        self._target: Any = None

    def write(self, text: str) -> int:
        target = self._target
        if target is not None:
            target.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[-256:]  # a line without its end yet, bounded
        for line in lines:
            found = _STAGE_LINE.search(line)
            if found:
                self.stages[found.group(1)] = float(found.group(2))
        return len(text)

    def flush(self) -> None:
        if self._target is not None:
            self._target.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty...: those of the stream it replaced
        return getattr(self._target, name)

    @contextmanager
    def capturing(self) -> Iterator[None]:
        # The stream it replaced stays its target after: a writer that kept a reference to
        # this object (a handler made meanwhile) still reaches the real stdout.
        if sys.stdout is self:  # already in place
            yield
            return
        self._target, sys.stdout = sys.stdout, self
        try:
            yield
        finally:
            sys.stdout = self._target


def empty_caches() -> None:
    """Free torch's CUDA or MPS cache after an unload, if torch is imported (best effort)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            mps.empty_cache()
    except Exception as exc:  # freeing caches is best effort
        log.warning("emptying the torch caches failed: %s", exc)


def device_memory() -> dict[str, int]:
    """CUDA or MPS memory, only if torch is already imported: never imports it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            return {"cuda_allocated": int(cuda.memory_allocated()), "cuda_reserved": int(cuda.memory_reserved())}
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            return {
                "mps_allocated": int(mps.current_allocated_memory()),
                "mps_driver": int(mps.driver_allocated_memory()),
            }
    except Exception:  # torch half-imported by the engine thread, or a backend without stats
        return {}
    return {}

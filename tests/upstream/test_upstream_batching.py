"""Batches across requests against the real upstream code: a spawned sidecar, tiny random models.

With greedy decoding (``do_sample=False``) and a seed per request, each request of a batch
must sound as it does alone.  "As it does alone" is its audio from the same sidecar when it
runs by itself (``synthesize()``, upstream's own generator, one request); "sound" is int16
PCM, compared sample by sample with a tolerance of one step (1/32768 of full scale): a
batched matrix product sums in another order than a one-row product, so floats differ in
their last bits (about 1e-7 relative), and after the 25 CFM steps and the vocoder that is
still far below one int16 step, except where a sample lies within that much of a rounding
boundary.  Those samples are few (measured: under 0.5% of a request's samples,
bench/probe_batch_equal.py), so the test also bounds their share (1%); a decoding that
drifted (another token, another noise) differs everywhere.

Concurrent requests form one batch because the sidecar waits for company (``--batch-wait-ms``,
2 s, against requests sent within milliseconds of one another); each batched request says
so in its progress ("in a batch of N").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from conftest import Flavour, flavour_named

from indextts_client import Audio, Client, ProgressEvent

#: Each test loads a sidecar and runs ten requests: minutes on two busy cores.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(1500)]

GITHUB = ["2", "2.5"]
#: The PyPI repackagings (``indextts2-inference`` 2.1.1, ``indextts25-inference`` 0.2.0).
PYPI = ["pypi2", "pypi2.5"]
#: Greedy, one beam, short: deterministic and quick on a CPU.
DETERMINISTIC: dict[str, Any] = {"max_mel_tokens": 12, "do_sample": False}
#: Samples (of each request) allowed to differ by one int16 step; none may differ by more.
SHARE = 0.01


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def batching_client(flavour: Flavour, ckpt: Path, **engine_options: Any) -> Client:
    options: dict[str, Any] = {"model_dir": str(ckpt), "device": "cpu", "max_batch": 4}
    if not flavour.pypi:
        options["use_qwen_emo"] = False
    options.update(engine_options)
    # indextts2-inference reads its auxiliary models from the Hugging Face cache: the fixture's.
    extra = {"HF_HOME": str(ckpt / "hf_home")} if flavour.name == "pypi2" else {}
    return Client(
        flavour.engine,
        python=flavour.python,
        engine_options=options,
        env=flavour.env(**extra),
        sidecar_args=("--batch-wait-ms", "2000"),
        ready_timeout=60,
        idle_timeout=300,
    )


def requests(ckpt: Path, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Three requests: two voices, one to three segments, each with its own seed."""
    voice, voice2 = str(ckpt / "voice.wav"), str(ckpt / "voice2.wav")
    # 2.5's tiny tokenizer has a token for about every character; IndexTTS-2's for about every word.
    segments = {"max_text_tokens_per_segment": 6 if name in ("2", "pypi2") else 20}
    return [
        ("Hello there.", {"voice": voice, "seed": 1}),
        ("Hello there. This is a test. We speak slowly.", {"voice": voice2, "seed": 2, **segments}),
        ("We speak slowly and clearly.", {"voice": voice, "seed": 3, **segments}),
    ]


def assert_equal_audio(alone: Audio, batched: Audio) -> None:
    a, b = alone.samples.astype(np.int32), batched.samples.astype(np.int32)
    assert a.shape == b.shape and a.size > 0
    difference = np.abs(a - b)
    assert int(difference.max()) <= 1, int(difference.max())
    assert np.count_nonzero(difference) <= SHARE * a.size, np.count_nonzero(difference)
    assert int(np.abs(a).max()) > 1000  # audio, not silence: random weights are loud


async def gather(c: Client, jobs: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], list[list[ProgressEvent]]]:
    """The jobs sent at once; each one's result (or exception) and progress."""
    results: list[Any] = [None] * len(jobs)
    events: list[list[ProgressEvent]] = [[] for _ in jobs]

    async def one(i: int, text: str, options: dict[str, Any]) -> None:
        try:
            results[i] = await c.synthesize(text, on_progress=events[i].append, **DETERMINISTIC, **options)
        except Exception as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i, (text, options) in enumerate(jobs):
            tg.start_soon(one, i, text, options)
    return results, events


def batch_sizes(events: list[ProgressEvent]) -> list[str]:
    return [e.message for e in events if e.message.startswith("in a batch of")]


@pytest.mark.parametrize(("name", "stages"), [(name, "auto") for name in GITHUB + PYPI] + [("2.5", "all")])
async def test_each_request_of_a_batch_sounds_as_it_does_alone(
    name: str, stages: str, checkpoints: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One sidecar (loading costs most of the time): alone, then batched, then a batch with a bad request.

    The PyPI repackagings run the same way: their model calls are intercepted like the GitHub
    code's, and every batched call runs as one batch (no load warning, no batch retried row by row).
    ``batch_stages``: ``auto`` is ``gpt`` on the CPU (the GPT's calls batched, each request's CFM and
    vocoder alone as its codes are ready); ``all`` batches them too.  Each request's ``done``
    says which ran.
    """
    caplog.set_level(logging.WARNING, logger="indextts_client.sidecar")
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    jobs = requests(ckpt, name)
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF but not audio at all")
    async with batching_client(flavour, ckpt, batch_stages=stages) as c:
        await c.load()
        assert c.info.max_batch == 4
        alone = []
        for text, options in jobs:
            events: list[ProgressEvent] = []
            alone.append(await c.synthesize(text, on_progress=events.append, **DETERMINISTIC, **options))
            assert batch_sizes(events) == []  # a lone request runs as a batch of one, which says nothing of batches

        batched, events_of = await gather(c, jobs)
        for i, result in enumerate(batched):
            assert isinstance(result, Audio), result
            assert batch_sizes(events_of[i]) == ["in a batch of 3"], [e.message for e in events_of[i]]
            assert_equal_audio(alone[i], result)
            assert result.facts["batch_stages"] == ("gpt" if stages == "auto" else stages), result.facts
        # Segments are streamed as they come: the three-segment request reports each one.
        ready = [e.message for e in events_of[1] if " ready (" in e.message]
        assert len(ready) >= 2, ready

        # A bad request fails alone; the others of its batch are unchanged.
        bad = ("Hello there.", {"voice": str(junk), "seed": 5})
        results, events_of = await gather(c, [jobs[0], bad, jobs[2]])
        assert batch_sizes(events_of[0]) == ["in a batch of 3"]
        assert isinstance(results[1], Exception) and "preparing the references failed" in str(results[1])
        assert_equal_audio(alone[0], results[0])
        assert_equal_audio(alone[2], results[2])
        # ... and the sidecar goes on serving; deterministic decoding repeats itself exactly.
        after = await c.synthesize(jobs[0][0], **DETERMINISTIC, **jobs[0][1])
        assert np.array_equal(after.samples, alone[0].samples)
    # The sidecar has exited and its stderr is drained: its warnings are all in.
    warnings = [r.getMessage() for r in caplog.records if r.name == "indextts_client.sidecar"]
    assert not [w for w in warnings if "one request after another" in w or "retrying row by row" in w], warnings

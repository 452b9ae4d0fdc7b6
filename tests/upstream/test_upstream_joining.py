"""Requests joining a running batch (continuous batching) against the real upstream code.

With greedy decoding and a seed, a request that joins a batch mid-way must sound as it does
alone, and so must the request it joined: the same tolerance as tests/upstream/
test_upstream_batching.py (at most one int16 step, on at most 1% of a request's samples; a
decoding that drifted differs everywhere).  A lone request, which the sidecar now runs
through the batch path as a batch of one, must sound as upstream's own generator makes it.

The adapter is driven in process by ``probe_joining.py`` in upstream's venv, so that the
test decides exactly when a request joins: the second when the first has one segment out
(the first is at its 2nd), the third when it has two (at its 3rd).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HERE, ROOT, flavour_named

#: Loads a model and runs nine requests: a minute or two on two busy cores.
pytestmark = pytest.mark.timeout(900)

#: Samples (of each request) allowed to differ by one int16 step; none may differ by more.
SHARE = 0.01


def assert_equal_audio(alone: np.ndarray, other: np.ndarray) -> None:
    a, b = alone.astype(np.int32), other.astype(np.int32)
    assert a.shape == b.shape and a.size > 0, (a.shape, b.shape)
    difference = np.abs(a - b)
    assert int(difference.max()) <= 1, int(difference.max())
    assert np.count_nonzero(difference) <= SHARE * a.size, np.count_nonzero(difference)
    assert int(np.abs(a).max()) > 1000  # audio, not silence: random weights are loud


def batch_notes(messages: list[str]) -> list[str]:
    return [m for m in messages if m.startswith(("in a batch of", "joined a batch of"))]


@pytest.mark.parametrize("name", ["2", "2.5"])
def test_a_request_that_joins_mid_way_sounds_as_alone_and_so_does_a_lone_batch(
    name: str, checkpoints: Any, tmp_path: Path
) -> None:
    flavour = flavour_named(name)
    ckpt = checkpoints(flavour)
    out = tmp_path / "probe"
    done = subprocess.run(
        [flavour.python, str(HERE / "probe_joining.py"), name, str(ckpt), str(out)],
        env={**os.environ, **flavour.env()},
        capture_output=True,
        text=True,
        timeout=840,
        cwd=str(ROOT),
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())

    def audio(way: str, i: int) -> np.ndarray:
        return np.load(out / f"{way}-{i}.npy")

    assert report["alone"][0]["ready"] >= 3  # the first has a 3rd segment for the third to join at
    for i in range(3):
        # A batch of one is upstream's generator alone: its audio, its progress, its facts.
        assert_equal_audio(audio("alone", i), audio("lone", i))
        assert batch_notes(report["lone"][i]["messages"]) == []
        assert report["lone"][i]["facts"]["voice_cache"] in ("hit", "miss")
        assert set(report["lone"][i]["facts"]["stages"]) == set(report["alone"][i]["facts"]["stages"])
        assert report["lone"][i]["ready"] == report["alone"][i]["ready"]
        # Joined mid-way, or joined by others: each sounds as alone.
        assert_equal_audio(audio("alone", i), audio("joined", i))
        assert report["joined"][i]["facts"]["voice_cache"] in ("hit", "miss")
    assert all(room == 3 for room in report["lone_join_calls"])  # max_batch 4, one running

    order = report["order"]
    joined = report["joined"]
    assert batch_notes(joined[0]["messages"]) == []  # started alone; the others said they joined
    for i, segments_out in ((1, 1), (2, 2)):
        at = order.index(f"join {i}")
        # It joined while the first ran, after the first's segments before it, and then
        # they shared steps: its audio came before the first's end.
        assert order.index("end 0") > order.index(f"audio {i}") > at
        assert order[:at].count("audio 0") >= segments_out
        notes = batch_notes(joined[i]["messages"])
        assert len(notes) == 1 and notes[0] in ("joined a batch of 2", "joined a batch of 3"), notes
    # The room each join was offered: max_batch less the requests running then.
    assert report["rooms"][0] == 3 and min(report["rooms"]) >= 1

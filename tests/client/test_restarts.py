"""The restart budget on its own: a clock of plain numbers, no process, no event loop."""

from __future__ import annotations

import pytest

from indextts_client import CrashedError, RestartLimitError, StartError
from indextts_client._supervision._restarts import RestartBudget, summary


def _budget(max_restarts: int = 3, window: float = 60.0) -> RestartBudget:
    return RestartBudget(max_restarts=max_restarts, window=window, backoff=0.5, max_backoff=10.0)


def test_the_backoff_doubles_per_recent_restart_up_to_the_maximum() -> None:
    budget = _budget(max_restarts=100, window=1000.0)
    delays = []
    for _ in range(7):
        delays.append(budget.delay(now=0.0, ended_at=0.0))
        budget.record(0.0)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_the_backoff_counts_from_the_end_of_the_last_session() -> None:
    budget = _budget()
    budget.record(100.0)
    # The second restart waits 1 s after the session ended at 104.2: 0.3 s are left at 104.9.
    assert budget.delay(now=104.9, ended_at=104.2) == pytest.approx(0.3)
    assert budget.delay(now=105.2, ended_at=104.2) == 0.0
    assert budget.delay(now=200.0, ended_at=104.2) == 0.0


def test_restarts_older_than_the_window_are_forgotten() -> None:
    budget = _budget(max_restarts=2, window=60.0)
    budget.record(10.0)
    budget.record(20.0)
    assert budget.spent(now=69.9)
    assert budget.recent(now=69.9) == 2
    assert not budget.spent(now=70.0)  # the first one left the window at exactly 10 + 60
    assert budget.recent(now=70.0) == 1
    assert budget.delay(now=70.0, ended_at=70.0) == 1.0  # one recent restart: the backoff doubled once
    assert budget.recent(now=80.0) == 0
    assert budget.delay(now=80.0, ended_at=80.0) == 0.5


def test_a_spent_budget_makes_the_client_dead_with_the_last_failure() -> None:
    budget = _budget(max_restarts=3, window=60.0)
    for start in (1.0, 2.0, 3.0):
        assert not budget.spent(now=start)
        budget.record(start)
    assert budget.dead is None and budget.dead_at is None
    crash = CrashedError("the sidecar exited (returncode 1)")
    assert budget.spent(now=4.0)
    dead = budget.give_up(crash, now=4.0)
    assert budget.dead is dead and budget.dead_at == 4.0
    assert isinstance(dead, RestartLimitError)
    assert dead.max_restarts == 3 and dead.restart_window == 60.0 and dead.last_error is crash
    assert dead.message == (
        "the sidecar failed 4 times within 60 s (max_restarts=3); the client gave up. "
        "Last failure: CrashedError: the sidecar exited (returncode 1)"
    )


def test_no_restart_at_all_with_max_restarts_zero() -> None:
    budget = _budget(max_restarts=0)
    assert budget.spent(now=0.0)
    dead = budget.give_up(ValueError("boom"), now=0.0)
    assert dead.message.startswith("the sidecar failed 1 times within 60 s (max_restarts=0)")
    assert dead.message.endswith("Last failure: ValueError: boom")


def test_a_failed_revive_keeps_the_client_dead_from_then() -> None:
    budget = _budget()
    first = budget.give_up(CrashedError("first"), now=5.0)
    failure = StartError("no ready frame")
    again = budget.revive_failed(failure, now=50.0)
    assert again is not first and budget.dead is again and budget.dead_at == 50.0
    assert again.last_error is failure
    assert again.message == "the sidecar could not be revived after its restart limit: StartError: no ready frame"


def test_reset_brings_the_client_back_with_a_fresh_budget() -> None:
    budget = _budget(max_restarts=2)
    budget.record(1.0)
    budget.record(2.0)
    budget.give_up(CrashedError("x"), now=3.0)
    budget.reset()
    assert budget.dead is None and budget.dead_at is None
    assert budget.recent(now=3.0) == 0
    assert not budget.spent(now=3.0)
    assert budget.delay(now=3.0, ended_at=3.0) == 0.5


def test_summary_is_one_line_without_the_stderr_tail() -> None:
    error = CrashedError("the sidecar exited", stderr_tail="Traceback ...\nboom")
    assert summary(error) == "CrashedError: the sidecar exited"
    assert summary(KeyError("k")) == "KeyError: 'k'"

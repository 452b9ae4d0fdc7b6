"""A client's sidecar settings: its defaults are _defaults.py's, it is checked once and cannot change."""

from __future__ import annotations

import dataclasses
import inspect
import ssl

import pytest

from indextts_client import Client
from indextts_client._supervision._process import Redactor
from indextts_client._supervision._settings import SidecarSettings


def test_the_defaults_are_the_clients() -> None:
    settings = SidecarSettings()
    client_defaults = inspect.signature(Client).parameters
    compared = 0
    for field in dataclasses.fields(SidecarSettings):
        if field.name in client_defaults and field.name not in ("redact", "token"):
            assert getattr(settings, field.name) == client_defaults[field.name].default, field.name
            compared += 1
    assert compared == len(dataclasses.fields(SidecarSettings)) - 2


def test_the_settings_cannot_change_once_built() -> None:
    settings = SidecarSettings(timeout=5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timeout = 6.0  # type: ignore[misc]
    assert dataclasses.replace(settings, timeout=6.0).timeout == 6.0 and settings.timeout == 5.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"heartbeat": 0.0}, r"heartbeat must be > 0 seconds or None"),
        ({"heartbeat": float("nan")}, r"heartbeat must be > 0 seconds or None"),
        ({"heartbeat_misses": 0}, "heartbeat_misses must be >= 1"),
    ],
)
def test_out_of_range_settings_are_refused_by_the_settings_and_the_client(
    changes: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SidecarSettings(**changes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        Client("fake", **changes)  # type: ignore[arg-type]


def test_the_restart_budget_is_built_from_the_settings() -> None:
    budget = SidecarSettings(
        max_restarts=2, restart_window=9.0, restart_backoff=0.25, max_restart_backoff=0.75
    ).restart_budget()
    assert (budget.max_restarts, budget.window, budget.backoff, budget.max_backoff) == (2, 9.0, 0.25, 0.75)
    assert budget.delay(now=0.0, ended_at=0.0) == 0.25
    assert budget.dead is None


def test_the_redactor_hides_the_secrets_it_was_given() -> None:
    settings = SidecarSettings(redact=Redactor({"API_KEY": "abcdef"}, ["swordfish"]))
    assert settings.redact("key abcdef, word swordfish") == "key ***, word ***"
    assert SidecarSettings().redact("nothing secret") == "nothing secret"


def test_a_client_refuses_two_ways_to_reach_its_sidecar() -> None:
    with pytest.raises(ValueError, match=r"give url \(a running sidecar\) or engine/command/python"):
        Client("fake", url="tcp://127.0.0.1:9")
    with pytest.raises(ValueError, match="token and ssl_context are for a sidecar reached by url"):
        Client("fake", token="secret")
    with pytest.raises(ValueError, match="ssl_context is for tcp://"):
        Client(url="unix:///tmp/none.sock", ssl_context=ssl.create_default_context())
    with pytest.raises(ValueError, match="pool_timeout must be >= 0"):
        Client("fake", pool_timeout=-1.0)
    assert Client(url="tcp://127.0.0.1:9").argv == []
    assert Client(url="tcp://127.0.0.1:9").url == "tcp://127.0.0.1:9"

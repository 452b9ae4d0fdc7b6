"""``POST /v1/audio/speech`` against a real ``serve`` process: the text each SSE segment event
says its audio speaks (the engines' segment spans), and engine options that would set the
client's own arguments.  The fake engine's spans are known by construction (each character
is ``seconds_per_char`` of one tone); espeak's are its sentences."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_support import TIMEOUT, Server, server, speech


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    with server("--engine", "fake") as running:
        yield running


def sse_events(s: Server, **body: Any) -> list[dict[str, Any]]:
    events = []
    with (
        httpx.Client(base_url=s.base, timeout=TIMEOUT) as http,
        http.stream("POST", "/v1/audio/speech", json=speech(stream_format="sse", **body)) as answer,
    ):
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    assert events[-1]["type"] == "speech.audio.done", events[-1]
    return events


def segments(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == "speech.audio.segment"]


def audio(events: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")


@pytest.mark.parametrize("name", ["timeout", "idle_timeout", "voice", "sample_rate", "on_progress"])
def test_options_that_would_set_the_clients_own_arguments_are_refused(fake: Server, name: str) -> None:
    body = speech(input="abcd", response_format="wav", options={name: None})
    answer = httpx.post(fake.base + "/v1/audio/speech", json=body, timeout=TIMEOUT)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["message"]) == (f"options.{name}", f"options.{name} is not an engine option")

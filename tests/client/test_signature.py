"""One request signature (issue 24): every facade takes exactly Requester's (and Client.stream_text's)
parameters, and what Pool forwards really reaches its member's request."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

import indextts_client
from indextts_client import BlockingClient, Client, Pool, RequestTimeoutError
from indextts_client._service.prepare import CLIENT_PARAMETERS
from indextts_client._signature import same_parameters
from indextts_client._wire._request import Requester
from indextts_sidecar.engines.fake import render_bytes

TIMEOUT = 30


def parameters_of(function: Callable[..., Any]) -> list[tuple[str, Any, Any, Any]]:
    """Each parameter after ``self``: name, kind, default and annotation, as ``inspect`` shows them."""
    parameters = list(inspect.signature(function).parameters.values())
    assert parameters[0].name == "self", function
    return [(p.name, p.kind, p.default, p.annotation) for p in parameters[1:]]


@pytest.fixture
def ray_client() -> Iterator[type]:
    """``indextts_client.ray.RayClient``, imported with a stand-in ``ray`` where Ray is not installed:
    its signatures need no cluster (tests/ray_serve runs it against a real one)."""
    if importlib.util.find_spec("ray") is not None:
        yield importlib.import_module("indextts_client.ray").RayClient
        return
    stand_in = types.ModuleType("ray")
    stand_in.serve = types.ModuleType("ray.serve")  # type: ignore[attr-defined]
    stand_in.exceptions = types.ModuleType("ray.exceptions")  # type: ignore[attr-defined]
    stand_in.exceptions.RayActorError = type("RayActorError", (Exception,), {})  # type: ignore[attr-defined]
    modules = {"ray": stand_in, "ray.serve": stand_in.serve, "ray.exceptions": stand_in.exceptions}  # type: ignore[attr-defined]
    sys.modules.update(modules)
    try:
        yield importlib.import_module("indextts_client.ray").RayClient
    finally:
        # Imported against the stand-in: gone again, so that no other test finds it.
        for name in ("ray", "ray.serve", "ray.exceptions", "indextts_client.ray"):
            sys.modules.pop(name, None)
        if hasattr(indextts_client, "ray"):
            delattr(indextts_client, "ray")


REQUEST_METHODS = ["synthesize", "stream"]


@pytest.mark.parametrize("method", REQUEST_METHODS)
@pytest.mark.parametrize("facade", [Client, Pool, BlockingClient, "RayClient"])
def test_every_facade_takes_exactly_the_requesters_parameters(
    facade: Any, method: str, request: pytest.FixtureRequest
) -> None:
    cls = request.getfixturevalue("ray_client") if facade == "RayClient" else facade
    expected = parameters_of(getattr(Requester, method))
    assert [name for name, *_ in expected][:7] == [
        "text",
        "voice",
        "emotion",
        "sample_rate",
        "on_progress",
        "timeout",
        "idle_timeout",
    ]
    assert parameters_of(getattr(cls, method)) == expected


@pytest.mark.parametrize("facade", [Pool, BlockingClient, "RayClient"])
def test_every_stream_text_takes_exactly_the_clients_parameters(facade: Any, request: pytest.FixtureRequest) -> None:
    cls = request.getfixturevalue("ray_client") if facade == "RayClient" else facade
    expected = parameters_of(Client.stream_text)
    got = parameters_of(cls.stream_text)
    if cls is BlockingClient:
        # Its fragments are a plain iterable (read in a worker thread), not an async one.
        assert got[0] == (
            "texts",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.empty,
            "Iterable[Fragment]",
        )
        got, expected = got[1:], expected[1:]
    assert "timeout" in [name for name, *_ in expected] and "lookahead" in [name for name, *_ in expected]
    assert got == expected


def test_a_drifted_signature_is_told_apart() -> None:
    class Drifted:
        def synthesize(self, text: str, *, voice: Any = None, emotion: Any = None, **options: Any) -> None:
            pass

    drift = parameters_of(Drifted.synthesize)
    assert drift != parameters_of(Requester.synthesize)
    assert "timeout" not in [name for name, *_ in drift]


def test_a_forwarding_method_must_take_what_its_signature_promises() -> None:
    with pytest.raises(TypeError, match=r"must take \(self, text, \*\*kwargs\)"):

        class Lacking:
            @same_parameters(Requester().synthesize)
            def synthesize(self, text: str) -> None:
                pass

    with pytest.raises(TypeError, match=r"must take \(self, text, \*\*kwargs\)"):

        class Renamed:
            @same_parameters(Requester().synthesize)
            def synthesize(self, words: str, **kwargs: Any) -> None:
                pass


def test_a_forwarding_method_names_only_the_sources_keywords_with_their_defaults() -> None:
    with pytest.raises(TypeError, match="lookahead must be the source's"):

        class Drifted:
            @same_parameters(Client.__new__(Client).stream_text)
            def stream_text(self, texts: Any, *, lookahead: int = 99, **kwargs: Any) -> None:
                pass


def test_the_service_core_knows_the_clients_own_parameters() -> None:
    """The names an engine option may not take are the request methods' keyword-only parameters."""
    names: set[str] = set()
    for method in (Client.stream, Client.synthesize, Client.request, Client.stream_text):
        parameters = inspect.signature(method).parameters.values()
        names.update(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)
    assert names == CLIENT_PARAMETERS


@pytest.mark.anyio
async def test_a_ray_client_sends_the_engine_options_as_one_mapping(ray_client: Any) -> None:
    calls: list[tuple[Any, ...]] = []

    class Response:
        """A DeploymentResponse already answered: awaited on asyncio, ``result()`` on trio."""

        def result(self) -> SynthesisResult:
            return SynthesisResult(samples=b"\0\0", sample_rate=22050, timings={}, facts={}, words=[], pid=1)

        def __await__(self) -> Any:
            yield from ()
            return self.result()

    class Method:
        def remote(self, *args: Any, **kwargs: Any) -> Response:
            calls.append((args, kwargs))
            return Response()

    class Handle:
        synthesize = Method()

    client = ray_client(Handle())
    SynthesisResult = importlib.import_module("indextts_client.ray._calls").SynthesisResult
    with anyio.fail_after(TIMEOUT):
        await client.synthesize("hello", timeout=5, options={"seconds": 1.0}, delay=0.5)
        with pytest.raises(TypeError, match="'delay' given both in options and as a keyword argument"):
            await client.synthesize("hello", options={"delay": 1.0}, delay=0.5)
    with pytest.raises(TypeError, match="'delay' given both"):
        client.stream_text(["hello."], options={"delay": 1.0}, delay=0.5)
    assert calls == [(("hello",), {"timeout": 5, "options": {"seconds": 1.0, "delay": 0.5}})]


@pytest.mark.anyio
async def test_a_ray_client_refuses_on_progress_before_calling_the_deployment(ray_client: Any) -> None:
    calls: list[tuple[Any, ...]] = []

    class Method:
        def remote(self, *args: Any, **kwargs: Any) -> None:
            calls.append((args, kwargs))

    class Handle:
        synthesize = Method()

    client = ray_client(Handle())
    with anyio.fail_after(TIMEOUT), pytest.raises(TypeError, match="callback would run in the replica"):
        await client.synthesize("hello", on_progress=print)
    with pytest.raises(TypeError, match="on_progress"):
        client.stream_text(["hello."], on_progress=print)
    assert calls == []


# ------------------------------------------------------------------ Pool forwards the deadlines


def fake_pool() -> Pool:
    return Pool("fake", size=1, ready_timeout=TIMEOUT)


@pytest.mark.anyio
async def test_a_pools_timeout_reaches_its_members_request() -> None:
    with anyio.fail_after(TIMEOUT):
        async with fake_pool() as pool:
            # hang_at=0: the member's request blocks until cancelled; only its deadline can end it.
            with pytest.raises(RequestTimeoutError) as timed_out:
                await pool.synthesize("abcdefghij", timeout=0.5, hang_at=0)
            assert isinstance(timed_out.value, TimeoutError)
            assert (timed_out.value.deadline, timed_out.value.seconds) == ("timeout", 0.5)
            # The request was cancelled on the sidecar: the member serves the next one at once.
            audio = await pool.synthesize("after")
            assert audio.samples.tobytes() == render_bytes("after")
            [health] = await pool.health()
            assert (health.outstanding, health.served, health.restarts) == (0, 1, 0)


@pytest.mark.anyio
async def test_a_pools_engine_options_reach_its_member_as_a_mapping() -> None:
    with anyio.fail_after(TIMEOUT):
        async with fake_pool() as pool:
            # hang_at=0 given in the mapping: only the deadline ends the request, so it arrived.
            with pytest.raises(RequestTimeoutError):
                await pool.synthesize("abcdefghij", timeout=0.5, options={"hang_at": 0})
            with pytest.raises(TypeError, match="'hang_at' given both in options and as a keyword argument"):
                await pool.synthesize("abcdefghij", options={"hang_at": 0}, hang_at=1)
            with pytest.raises(TypeError, match="options must be a mapping, not list"):
                await pool.synthesize("abcdefghij", options=[("hang_at", 0)])  # type: ignore[arg-type]
            audio = await pool.synthesize("after", options={"chunk_seconds": 0.3})
            assert audio.samples.tobytes() == render_bytes("after")


@pytest.mark.anyio
async def test_a_pools_idle_timeout_reaches_its_members_stream() -> None:
    with anyio.fail_after(TIMEOUT):
        async with fake_pool() as pool:
            chunks: list[bytes] = []

            async def listen() -> None:
                async with pool.stream("abcdefghij", idle_timeout=1.0, chunk_seconds=0.3, hang_at=1) as stream:
                    async for chunk in stream:
                        chunks.append(chunk.samples.tobytes())

            with pytest.raises(RequestTimeoutError) as timed_out:
                await listen()
            assert (timed_out.value.deadline, timed_out.value.seconds) == ("idle_timeout", 1.0)
            # Chunk 0 came before the hang: what was delivered is exact.
            assert len(chunks) == 1 and render_bytes("abcdefghij").startswith(chunks[0])
            [health] = await pool.health()
            assert health.outstanding == 0

"""BlockingClient: the Client API from synchronous code, over a real sidecar, on asyncio and trio."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from client_support import FAKE_OPTIONS, expected

from indextts_client import BlockingClient, ClosedError, LoadInfo, StartError

pytestmark = pytest.mark.timeout(60)
BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])


def make(backend: str, **kwargs: object) -> BlockingClient:
    return BlockingClient("fake", engine_options=FAKE_OPTIONS, backend=backend, restart_backoff=0.0, **kwargs)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "indextts_client BlockingClient"]


@BACKENDS
def test_synthesize_stream_and_friends_without_async(backend: str) -> None:
    client = make(backend)
    assert not client.is_alive()
    with client:
        assert client.is_alive() and client.info.engine == "fake"
        audio = client.synthesize("blocking")
        assert audio.samples.tobytes() == expected("blocking")
        with client.stream("streamed", chunk_seconds=0.02) as chunks:
            received = list(chunks)
        assert chunks.finished and [c.seq for c in received] == list(range(len(received))) and len(received) > 1
        assert b"".join(c.samples.tobytes() for c in received) == expected("streamed")
        info = client.load()
        assert isinstance(info, LoadInfo) and info.loaded
        assert client.ping().loaded
        first = client.pid
        client.restart()
        assert client.pid != first and not client.ping().loaded
    assert client.closed and not client.is_alive()
    assert loop_threads() == []
    with pytest.raises(ClosedError):
        client.synthesize("after close")


@BACKENDS
def test_leaving_a_stream_early_cancels_it(backend: str) -> None:
    with make(backend) as client:
        # 60 s of audio at 10 ms per 50 ms chunk: 12 s if it were not cancelled.
        with client.stream("endless", seconds=60, chunk_seconds=0.05, delay=0.01) as chunks:
            for chunk in chunks:
                assert chunk.seq == 0
                break
        assert chunks.finished
        # Not cancelled, the request would hold the engine for 12 s; cancelled, "next" runs at once.
        began = time.monotonic()
        assert client.synthesize("next").samples.tobytes() == expected("next")
        assert time.monotonic() - began < 5
        stream = client.stream("bare")
        with pytest.raises(RuntimeError, match=r"iterate inside 'with client\.stream"):
            next(iter(stream))


@BACKENDS
def test_calls_from_many_threads_share_one_sidecar(backend: str) -> None:
    texts = [f"thread {i}" for i in range(6)]
    with make(backend) as client, ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda text: client.synthesize(text).samples.tobytes(), texts))
        assert client.restarts == 0
    assert results == [expected(text) for text in texts]


@BACKENDS
def test_a_failed_start_raises_and_leaves_no_thread(backend: str) -> None:
    client = BlockingClient("no-such-engine", backend=backend)
    with pytest.raises(StartError, match="unknown engine 'no-such-engine'"):
        client.start()
    assert loop_threads() == []
    client.close()
    with pytest.raises(ClosedError):
        client.start()


def test_a_loop_that_cannot_start_raises_its_error_and_leaves_the_client_startable() -> None:
    client = BlockingClient("fake", backend="no-such-backend")
    for _ in range(2):  # not "already started": nothing of the first try is left
        with pytest.raises(LookupError, match="no-such-backend"):
            client.start()
        assert loop_threads() == []
    client.close()

"""An OpenAI-compatible speech endpoint, and a request to it, in one script.

    python examples/serve_http.py [ENGINE]      (default: espeak; needs the [server] extra and httpx)

The same server from a shell: ``indextts-client serve --engine espeak --port 8000``; any
OpenAI client then works with ``base_url="http://127.0.0.1:8000/v1"``.  An engine that cannot
load (espeak without the [espeak] extra) ends it at once with one line saying why, exit 1.
"""

from __future__ import annotations

import socket
import sys

import anyio
import httpx
import uvicorn

from indextts_client.http import create_app


async def main(engine: str) -> str | None:
    """Serve, ask for speech, stop; the reason it could not, if it could not."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # bound and listening first: requests wait in the backlog until the app is up
    port = listener.getsockname()[1]
    ready = anyio.Event()  # set once the app's engine loaded, or once it could not (in failed)
    failed: list[BaseException] = []
    app = create_app(engine, size=1, on_ready=ready.set, on_start_failure=lambda exc: [failed.append(exc), ready.set()])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [listener])
        with anyio.fail_after(60):
            await ready.wait()  # /health says "starting" (503) until then
        if failed:
            server.should_exit = True
            return f"serve_http: the engine could not start: {failed[0]}"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            answer = await http.post(
                "/v1/audio/speech", json={"model": "indextts", "input": "Hello over HTTP.", "voice": "alloy"}
            )  # mp3, OpenAI's default format
            answer.raise_for_status()
            print(f"got {len(answer.content)} bytes of {answer.headers['content-type']}")
        server.should_exit = True
    return None


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "espeak"))  # a reason: exit 1

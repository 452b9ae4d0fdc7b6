"""Several concurrent requests over one sidecar; two of them given up early.

::

    python examples/concurrent_and_cancel.py

Uses the fake engine, whose ``delay`` and ``seconds`` request options make a request take
as long as we like.  The sidecar runs one inference at a time, first come first served;
a request abandoned by its caller (a cancel scope, or its own ``timeout``) is cancelled
on the sidecar, which lives on with its model loaded: no restart, same pid.
"""

from __future__ import annotations

import anyio

from indextts_client import Client, RequestTimeoutError


async def short(client: Client, n: int) -> None:
    audio = await client.synthesize(f"request {n}", delay=0.02)
    print(f"short {n}: {audio.duration:.2f} s of audio, queued {audio.timings.get('queued', 0):.2f} s")


async def cancelled_by_scope(client: Client) -> None:
    # 60 s of audio in 0.5 s chunks, 0.05 s apiece: 6 s of work, given up after 0.3 s.
    with anyio.move_on_after(0.3) as scope:
        await client.synthesize("long", seconds=60, delay=0.05)
    print(f"long: cancelled by its scope: {scope.cancelled_caught}")


async def timed_out(client: Client) -> None:
    try:
        await client.synthesize("also long", seconds=60, delay=0.05, timeout=0.5)
    except RequestTimeoutError as exc:
        print(f"timed out: {exc.deadline} after {exc.seconds:g} s")


async def main() -> None:
    async with Client("fake") as client:
        await client.load()  # warm up before the first request
        pid = client.pid
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_by_scope, client)
            tg.start_soon(timed_out, client)
            for n in range(3):
                tg.start_soon(short, client, n)
        health = await client.ping()
        print(f"after: loaded={health.loaded} queue_depth={health.queue_depth} active={health.active}")
        print(f"same sidecar: {client.pid == pid}, restarts: {client.restarts}")


if __name__ == "__main__":
    anyio.run(main)

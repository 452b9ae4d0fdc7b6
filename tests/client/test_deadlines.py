"""The connection's deadline alarm (``indextts_client._wire._deadlines``), alone: no process, no connection."""

from __future__ import annotations

import anyio
import pytest

from indextts_client._wire._deadlines import DeadlineAlarm
from indextts_client._wire._exchange import Exchange, wakeup_class
from indextts_sidecar import protocol

pytestmark = pytest.mark.anyio

#: Far enough that reaching it means the alarm failed: every test is bounded well below it.
FAR = 60.0


def _exchange(request_id: int = 1) -> Exchange:
    return Exchange(request_id, anyio.current_time(), anyio.Event)


async def test_a_waiting_request_is_woken_once_its_deadline_has_passed_and_not_before() -> None:
    alarm = DeadlineAlarm()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(alarm.run)
            await anyio.wait_all_tasks_blocked()
            assert alarm.running
            exchange = _exchange()
            deadline = anyio.current_time() + 0.05
            await alarm.wait(exchange, deadline)
            assert anyio.current_time() >= deadline
            assert exchange.deadline == deadline and alarm.waiting == 0
            assert not exchange.items and exchange.error is None
            tg.cancel_scope.cancel()


async def test_a_frame_wakes_the_request_before_its_deadline() -> None:
    alarm = DeadlineAlarm()
    exchange = _exchange(7)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(alarm.run)
            await anyio.wait_all_tasks_blocked()
            woke: list[float] = []

            async def waiter() -> None:
                await alarm.wait(exchange, anyio.current_time() + FAR)
                woke.append(anyio.current_time())

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert alarm.waiting == 1
            exchange.receive(protocol.Pong(id=7, loaded=True, queue_depth=0), anyio.current_time(), True, bool)
            await anyio.wait_all_tasks_blocked()
            assert len(woke) == 1 and alarm.waiting == 0
            assert [type(item) for item in exchange.items] == [protocol.Pong]
            tg.cancel_scope.cancel()


async def test_an_earlier_deadline_moves_the_alarm_and_wakes_only_the_due_request() -> None:
    alarm = DeadlineAlarm()
    late, soon = _exchange(1), _exchange(2)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(alarm.run)
            await anyio.wait_all_tasks_blocked()
            late_woke = anyio.Event()

            async def wait_late() -> None:
                await alarm.wait(late, anyio.current_time() + FAR)
                late_woke.set()

            tg.start_soon(wait_late)
            await anyio.wait_all_tasks_blocked()
            deadline = anyio.current_time() + 0.05
            await alarm.wait(soon, deadline)  # would take FAR if the alarm slept on to the first deadline
            assert anyio.current_time() >= deadline
            await anyio.wait_all_tasks_blocked()
            assert not late_woke.is_set() and alarm.waiting == 1
            tg.cancel_scope.cancel()


async def test_without_a_running_alarm_a_wait_keeps_its_own_deadline() -> None:
    alarm = DeadlineAlarm()
    assert not alarm.running
    exchange = _exchange()
    with anyio.fail_after(10):
        deadline = anyio.current_time() + 0.05
        await alarm.wait(exchange, deadline)
        assert anyio.current_time() >= deadline
    assert alarm.waiting == 0


async def test_an_alarm_that_stops_wakes_every_waiting_request() -> None:
    alarm = DeadlineAlarm()
    first, second = _exchange(1), _exchange(2)
    woke: list[int] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            alarm_scope = anyio.CancelScope()

            async def run_alarm() -> None:
                with alarm_scope:
                    await alarm.run()

            async def waiter(exchange: Exchange) -> None:
                await alarm.wait(exchange, anyio.current_time() + FAR)
                woke.append(exchange.id)

            tg.start_soon(run_alarm)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(waiter, first)
            tg.start_soon(waiter, second)
            await anyio.wait_all_tasks_blocked()
            assert alarm.waiting == 2
            alarm_scope.cancel()
        assert sorted(woke) == [1, 2]
        assert not alarm.running and alarm.waiting == 0


async def test_the_backends_own_wakeup_survives_a_cancelled_wait_and_wakes_the_next_one() -> None:
    # The connection's exchanges sleep on the running backend's cheapest wakeup (an asyncio
    # future, a parked trio task): a wait cancelled half way must leave nothing the next reuses.
    exchange = Exchange(3, anyio.current_time(), wakeup_class())
    with anyio.fail_after(10):
        with anyio.move_on_after(0.01) as scope:
            await exchange.wait()
        assert scope.cancelled_caught
        exchange.wake()  # nobody waits: nothing to wake, no error
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                await exchange.wait()

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert exchange.wakeup is not None
            exchange.receive(protocol.Ok(id=3), anyio.current_time(), True, lambda _: False)
        assert exchange.next_item() == protocol.Ok(id=3) and exchange.wakeup is None

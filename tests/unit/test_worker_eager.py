"""An async handler's first step runs at once, without a task (worker._start_eagerly).

A handler that returns without awaiting is done before _start_eagerly returns
(no task); one that awaits is finished by a task that sees exactly what a task
created for the whole coroutine would: the values its awaits resolve to, a
cancellation at the await it is stopped at, its exception, and one context
of its own (copied from the caller's, never written back to it).
"""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from scheduler.delivery.worker import _start_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller's")


def run(main):
    return asyncio.run(main())


def test_a_coroutine_that_never_awaits_finishes_in_the_call_and_makes_no_task() -> None:
    done: list[str] = []

    async def handler() -> None:
        done.append("ran")

    async def main():
        task = _start_eagerly(handler())
        assert done == ["ran"]  # before _start_eagerly returned
        return task, len(asyncio.all_tasks())

    task, tasks = run(main)
    assert task is None
    assert tasks == 1  # main's own task only


def test_a_coroutine_that_awaits_is_finished_by_a_task_with_every_awaited_value() -> None:
    steps: list[object] = []

    async def handler(future: asyncio.Future[int]) -> str:
        steps.append("first step")
        value = await future
        steps.append(value)
        await asyncio.sleep(0)  # a bare yield (None) in the middle
        steps.append(await asyncio.sleep(0.01, result="slept"))
        return "returned"

    async def main():
        future = asyncio.get_running_loop().create_future()
        task = _start_eagerly(handler(future))
        assert steps == ["first step"]
        assert task is not None and not task.done()
        future.set_result(42)
        return await task

    assert run(main) == "returned"
    assert steps == ["first step", 42, "slept"]


def test_a_cancellation_reaches_the_coroutine_at_its_await() -> None:
    seen: list[str] = []

    async def catches() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("caught")
            return "cleaned up"
        return "slept"

    async def reraises() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("re-raised")
            raise

    async def main():
        first, second = _start_eagerly(catches()), _start_eagerly(reraises())
        assert first is not None and second is not None
        await asyncio.sleep(0)
        first.cancel()
        second.cancel()
        assert await first == "cleaned up"
        with pytest.raises(asyncio.CancelledError):
            await second
        return first.cancelled(), second.cancelled()

    assert run(main) == (False, True)
    assert seen == ["caught", "re-raised"]


def test_a_cancellation_at_a_bare_yield_is_thrown_into_the_coroutine() -> None:
    """No future is awaited there (``asyncio.sleep(0)``): the task can only throw the
    cancellation in, and the coroutine must see it, not resume as if nothing happened."""
    seen: list[str] = []

    async def handler() -> None:
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append("resumed")

    async def main():
        task = _start_eagerly(handler())
        assert task is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)
    assert seen == ["cancelled"]


def test_an_error_after_an_await_is_the_tasks() -> None:
    async def handler() -> None:
        await asyncio.sleep(0)
        raise KeyError("late")

    async def main():
        task = _start_eagerly(handler())
        assert task is not None
        with pytest.raises(KeyError, match="late"):
            await task

    run(main)


def test_an_error_in_the_first_step_propagates_from_the_call() -> None:
    async def handler() -> None:
        raise ValueError("early")

    async def main():
        with pytest.raises(ValueError, match="early"):
            _start_eagerly(handler())

    run(main)


def test_the_coroutine_has_a_context_of_its_own_before_and_after_its_await() -> None:
    seen: list[str] = []

    async def handler(name: str) -> None:
        seen.append(VAR.get())
        VAR.set(name)
        await asyncio.sleep(0)
        seen.append(VAR.get())

    async def main():
        tasks = [_start_eagerly(handler("a")), _start_eagerly(handler("b"))]
        after_start = VAR.get()
        await asyncio.gather(*(t for t in tasks if t is not None))
        return after_start, VAR.get()

    assert run(main) == ("caller's", "caller's")
    assert seen == ["caller's", "caller's", "a", "b"]

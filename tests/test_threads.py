"""Splitting a batch's per-item work across threads: every item once, errors propagate, and
with ``chunk`` a slow item holds up no item queued after it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fastdata._threads import parallel_for


@pytest.mark.parametrize("chunk", [None, 1, 3])
@pytest.mark.parametrize("count", [0, 1, 3, 17])
def test_every_item_is_run_once(chunk: int | None, count: int) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def body(start: int, stop: int) -> None:
        with lock:
            seen.extend(range(start, stop))

    with ThreadPoolExecutor(2) as executor:
        parallel_for(executor, count, body, tasks=3, chunk=chunk)
    assert sorted(seen) == list(range(count))


@pytest.mark.parametrize("chunk", [None, 1])
def test_an_error_in_any_item_reaches_the_caller(chunk: int | None) -> None:
    def body(start: int, stop: int) -> None:
        if 6 in range(start, stop):
            raise ValueError("item 6")

    with ThreadPoolExecutor(1) as executor, pytest.raises(ValueError, match="item 6"):
        parallel_for(executor, 8, body, tasks=2, chunk=chunk)


def test_with_chunks_a_slow_item_does_not_hold_up_the_items_after_it() -> None:
    """Item 0 waits until every other item has run: with equal slices the items after it
    in its slice would wait for it (the event never set); taken one at a time, the other
    thread runs them all."""
    count = 8
    others_done = threading.Event()
    done: set[int] = set()
    lock = threading.Lock()
    waited: list[bool] = []

    def body(start: int, stop: int) -> None:
        for item in range(start, stop):
            if item == 0:
                waited.append(others_done.wait(timeout=30))
                continue
            with lock:
                done.add(item)
                if len(done) == count - 1:
                    others_done.set()

    with ThreadPoolExecutor(1) as executor:
        parallel_for(executor, count, body, tasks=2, chunk=1)
    assert waited == [True]
    assert done == set(range(1, count))


def test_with_chunks_an_error_returns_only_once_no_thread_runs_an_item() -> None:
    """The calling thread's item raises once the pool thread runs one of its own, which is
    still running then (it waits up to a second for a release the test gives only
    afterwards): the error must not reach the caller before that item has finished."""
    caller = threading.current_thread()
    other_started = threading.Event()
    release = threading.Event()
    running: list[int] = []
    lock = threading.Lock()

    def body(start: int, stop: int) -> None:
        for item in range(start, stop):
            with lock:
                running.append(item)
            try:
                if threading.current_thread() is caller:
                    assert other_started.wait(timeout=30)
                    raise ValueError("the caller's item")
                other_started.set()
                release.wait(timeout=1)
            finally:
                with lock:
                    running.remove(item)

    with ThreadPoolExecutor(1) as executor:
        with pytest.raises(ValueError, match="the caller's item"):
            parallel_for(executor, 4, body, tasks=2, chunk=1)
        still_running = list(running)
        release.set()
    assert still_running == []

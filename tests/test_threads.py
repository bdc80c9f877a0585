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

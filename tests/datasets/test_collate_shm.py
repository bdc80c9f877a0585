"""passthrough_collate and the memfd SharedBuffer."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import numpy as np
import pytest
import torch

from fastdata.datasets import passthrough_collate
from fastdata.datasets._shm import SharedBuffer


def test_passthrough_keeps_batches_and_collates_lists() -> None:
    batch = ([torch.zeros(3, dtype=torch.uint8)], torch.tensor([1, 2]))
    assert passthrough_collate(batch) is batch
    collated = passthrough_collate([(torch.ones(2), 1), (torch.zeros(2), 0)])
    assert collated[0].shape == (2, 2) and collated[1].tolist() == [1, 0]


def _child_writes(buffer: SharedBuffer, queue: Any) -> None:
    buffer.array[:4] = [9, 8, 7, 6]
    queue.put(int(buffer.array[4:].sum()))
    buffer.close()


def test_spawned_child_maps_the_same_memory() -> None:
    buffer = SharedBuffer(1 << 16, "test")
    buffer.array[4:] = 1
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_child_writes, args=(buffer, queue))
    child.start()
    assert queue.get(timeout=60) == (1 << 16) - 4  # the child saw our bytes...
    child.join()
    np.testing.assert_array_equal(buffer.array[:4], [9, 8, 7, 6])  # ...and we see its
    buffer.close()
    assert buffer.closed and buffer.array.size == 0
    buffer.close()  # closing twice is harmless
    with pytest.raises(ValueError, match="cannot pickle a closed SharedBuffer"):
        buffer.__reduce__()


def test_empty_and_negative_sizes() -> None:
    empty = SharedBuffer(0)
    assert empty.array.size == 0 and empty.fd >= 0
    empty.close()
    with pytest.raises(ValueError, match="nbytes must be >= 0, got -1"):
        SharedBuffer(-1)

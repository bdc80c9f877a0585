"""The one walker over a batch's tensors, as the tuner and profiler use it."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import torch

from fastdata._batch import batch_nbytes, iter_tensors, map_tensors
from fastdata.gpu import _batch as gpu_batch
from fastdata.tune._measure import batch_nbytes as measured_nbytes
from fastdata.tune._stages import copy_batch


class Sample(NamedTuple):
    image: torch.Tensor
    label: torch.Tensor
    name: str


def _batch() -> Sample:
    return Sample(torch.zeros(2, 3, dtype=torch.uint8), torch.arange(2), "a")


def test_copy_batch_keeps_named_tuples_and_mapping_types() -> None:
    batch = {"x": [_batch()], "y": OrderedDict(z=torch.ones(1, dtype=torch.float64))}
    moved = copy_batch(batch, torch.device("cpu"), non_blocking=False)
    assert isinstance(moved["x"][0], Sample)
    assert moved["x"][0].name == "a"
    assert torch.equal(moved["x"][0].label, torch.arange(2))
    assert isinstance(moved["y"], OrderedDict)


def test_copy_batch_moves_every_tensor() -> None:
    dtype = torch.float64
    seen: list[torch.Tensor] = []
    moved = map_tensors(_batch(), lambda t: seen.append(t) or t.to(dtype))
    assert len(seen) == 2
    assert all(t.dtype == dtype for t in iter_tensors(moved))


def test_batch_nbytes_counts_tensors_arrays_and_bytes_in_named_tuples() -> None:
    batch = [_batch(), {"raw": b"12345", "arr": np.zeros(4, dtype=np.int32)}, 7]
    assert batch_nbytes(batch) == 6 + 2 * 8 + 5 + 16
    assert measured_nbytes is batch_nbytes


def test_the_device_modules_walk_with_the_same_functions() -> None:
    assert gpu_batch.map_tensors is map_tensors
    assert gpu_batch.iter_tensors is iter_tensors

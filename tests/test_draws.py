"""The draws behind every augmentation: keyed per sample by the epoch, or a stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata._draws import UniformDraws, batch_draws, keyed_uniform


def test_keyed_draws_depend_on_seed_epoch_and_index_only() -> None:
    indices = np.array([5, 0, 9, 5], np.int64)
    draws = keyed_uniform(3, 1, indices, 4)
    assert draws.shape == (4, 4) and draws.dtype == np.float64
    assert ((draws >= 0) & (draws < 1)).all()
    np.testing.assert_array_equal(draws[0], draws[3])  # the same sample, the same draw
    # a sample's row is the same in any batch, at any position
    np.testing.assert_array_equal(keyed_uniform(3, 1, np.array([9]), 4)[0], draws[2])
    for other in (keyed_uniform(4, 1, indices, 4), keyed_uniform(3, 2, indices, 4)):
        assert not np.isin(other, draws).any()  # another seed or epoch: other draws
    # large and negative seeds and epochs are fine; the draws look uniform
    many = keyed_uniform(-(2**70), 2**40, np.arange(200_000), 2)
    assert abs(many.mean() - 0.5) < 0.005 and abs(np.corrcoef(many.T)[0, 1]) < 0.01


def test_a_seeded_draw_of_the_batch_size_is_keyed_inside_batch_draws() -> None:
    draws = UniformDraws(7)
    indices = np.array([4, 2, 8])
    with batch_draws(3, indices):
        inside = draws.uniform(3, 2)
        other_size = draws.uniform(2, 1)  # not this batch's rows: the stream
    np.testing.assert_array_equal(inside, keyed_uniform(7, 3, indices, 2))
    stream = torch.rand((2, 1), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    np.testing.assert_array_equal(other_size, stream.numpy())
    # without a seed: torch's default generator, as before
    torch.manual_seed(0)
    with batch_draws(3, indices):
        unseeded = UniformDraws().uniform(3, 2)
    torch.manual_seed(0)
    np.testing.assert_array_equal(unseeded, torch.rand((3, 2), dtype=torch.float64).numpy())


def test_set_epoch_restarts_the_stream_from_seed_and_epoch() -> None:
    first, second = UniformDraws(11), UniformDraws(11)
    first.uniform(5, 4)  # epoch 0 drawn by one, not by the other
    first.set_epoch(1)
    second.set_epoch(1)
    np.testing.assert_array_equal(first.uniform(3, 2), second.uniform(3, 2))
    second.set_epoch(2)
    assert not np.array_equal(first.uniform(3, 2), second.uniform(3, 2))
    assert repr(second) == "UniformDraws(seed=11, epoch=2)"
    with pytest.raises(TypeError, match="epoch must be an int, got '1'"):
        second.set_epoch("1")  # type: ignore[arg-type]

"""Host → device copies that never make the host wait for the device, shared by the
decoders, the device augmentations and the mixing kernel."""

from __future__ import annotations

import numpy as np
import torch


def copy_to_device(
    host: torch.Tensor, device: torch.device, *, pinned: bool | None = None
) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, without making the host wait for the device.

    On CUDA the tensor is pinned first (unless it is) and copied with ``non_blocking=True``,
    ordered on the current stream: a copy from pageable memory would block the host until
    all work queued on that stream (e.g. the training step) is done. The caching host
    allocator keeps pinned memory from reuse until the copy that reads it is done, so
    ``host`` may be dropped at once. Other devices get a plain copy. ``pinned``: whether
    ``host`` is in pinned memory, where the caller knows (the driver is asked otherwise).
    """
    if host.device == device:
        return host
    if host.device.type != "cpu":  # already on a device: a device-to-device copy
        return host.to(device, non_blocking=True)
    if device.type == "cuda":
        if not (host.is_pinned() if pinned is None else pinned):
            host = host.pin_memory()
        return host.to(device, non_blocking=True)
    return host.to(device)


def upload(
    array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A NumPy array on ``device`` (see :func:`copy_to_device`), cast to ``dtype`` on the
    host first (the same rounding as on the device; fewer bytes, no cast kernel there).

    On CUDA the array is written straight into pinned memory: pinning a copy afterwards
    asks the driver twice whether the copy is pinned already, which costs the host more
    than the copy itself for the small arrays of a batch's parameters.
    """
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return copy_to_device(tensor if dtype is None else tensor.to(dtype), device)
    # the cast, if any, in the same host copy
    pinned = torch.empty(
        tensor.shape, dtype=tensor.dtype if dtype is None else dtype, pin_memory=True
    )
    return copy_to_device(pinned.copy_(tensor), device, pinned=True)

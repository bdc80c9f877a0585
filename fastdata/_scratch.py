"""Per-thread scratch arrays: the intermediate images of a per-sample path (a decoded
JPEG, a filtered or resized copy) reused from one sample to the next instead of
allocated, page-faulted and freed for each."""

from __future__ import annotations

import threading

import numpy as np

_MIN_BYTES = 1 << 20
_buffers = threading.local()


def scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of ``shape``, this thread's buffer ``name`` (grown when too small).

    Its contents are stale, and the next call with the same ``name`` on this thread
    returns the same memory: use it before then.
    """
    size = 1
    for extent in shape:
        size *= extent
    held: dict[str, np.ndarray] | None = getattr(_buffers, "held", None)
    if held is None:
        held = _buffers.held = {}
    buffer = held.get(name)
    if buffer is None or buffer.size < size:
        buffer = held[name] = np.empty(max(size, _MIN_BYTES), np.uint8)
    return buffer[:size].reshape(shape)

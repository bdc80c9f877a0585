"""A child forked from a process that uses CUDA never collects what it inherits.

A forked child (a DataLoader worker, a preprocessing worker) cannot call CUDA: the driver's
state does not survive ``fork()``. Freeing some inherited CUDA objects calls it anyway: a
tensor that a side stream used (``record_stream``, as the device prefetcher and the GPU
decoders do) makes the caching allocator record an event when it is freed, and the CUDA
error that raises inside a destructor aborts the process. Reference cycles that were
garbage at the fork (an exception's traceback holding a decoded batch, say) are freed by the
child's first garbage collection, at any allocation: the worker dies with ``SIGABRT``.

So the child of a process whose CUDA is initialized moves everything it inherits into the
garbage collector's permanent generation (``gc.freeze()``, what the ``gc`` documentation
advises for forked servers): its collector never visits those objects, so never frees
them (they cost the child no memory until written, and it never runs them), and leaves their
pages shared with the parent. What the child makes itself is collected as usual. Processes
that never initialize CUDA are left alone.
"""

from __future__ import annotations

import gc
import os
import sys


class _ForkedFromCuda:
    """Whether CUDA was initialized in the process as it forked."""

    def __init__(self) -> None:
        self.cuda = False

    def before(self) -> None:
        # torch is never imported here (a process without it has no CUDA), and may be half
        # imported by another thread
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        self.cuda = cuda is not None and cuda.is_initialized()

    def after_in_child(self) -> None:
        if self.cuda:
            gc.freeze()


_FORKS = _ForkedFromCuda()
os.register_at_fork(before=_FORKS.before, after_in_child=_FORKS.after_in_child)

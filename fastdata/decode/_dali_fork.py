"""DALI pipelines inherited by a forked child are never destroyed there.

A DALI pipeline runs worker threads, and its destructor stops and joins them. A forked
child (a DataLoader worker, a preprocessing worker) gets a copy of every pipeline the parent
held at the fork, but none of their threads: if the child dropped the last reference to such
a copy and the garbage collector freed it, the destructor would wait for threads that do not
exist, and the child would hang. So every pipeline built here is tracked (weakly), and a
forked child takes a reference to every tracked pipeline it inherits that it keeps until it
exits: the copies are never freed in the child (they cost no memory there until written,
and the child never runs them), and they are taken out of the set of pipelines that DALI
shuts down when the interpreter exits (``Pipeline._pipes``, for the same reason). Pipelines
the child builds itself are freed as usual.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any

_built: weakref.WeakSet[Any] = weakref.WeakSet()


def track(pipeline: Any) -> Any:
    """Track ``pipeline`` (a built ``nvidia.dali.Pipeline``) and return it."""
    _built.add(pipeline)
    return pipeline


def _keep_inherited() -> None:
    """In a forked child: keep every inherited pipeline referenced until the child exits.

    The reference is added to the object's own count (not held in a container), so that it
    survives the interpreter's shutdown too (a child that returns from ``os.fork()`` and
    exits normally clears module globals, which would free pipelines held in one); the
    inherited pipelines are no longer tracked in the child, nor shut down by DALI at exit.
    """
    inherited = list(_built)
    _built.clear()
    for pipeline in inherited:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(pipeline))
        shut_down_at_exit = getattr(type(pipeline), "_pipes", None)
        if isinstance(shut_down_at_exit, set):
            shut_down_at_exit.discard(weakref.ref(pipeline))


os.register_at_fork(after_in_child=_keep_inherited)

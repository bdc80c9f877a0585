"""A child forked from a process that uses CUDA never collects the objects it inherits: one
of them may be a CUDA tensor whose freeing calls CUDA, which aborts a forked child. Here
without a GPU (CUDA's state faked); ``tests/gpu/test_cuda_fork.py`` forks from real CUDA."""

from __future__ import annotations

import gc
import os

import pytest
import torch

import fastdata  # noqa: F401 - registers the fork hook under test

COLLECTED = b"collected"


class _Cycle:
    """Half of a reference cycle; writes to ``fd`` when it is freed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.partner: _Cycle | None = None

    def __del__(self) -> None:
        os.write(self.fd, COLLECTED)


def _collected_in_child() -> bool:
    """Leaves a reference cycle as garbage, forks, and tells whether the child's garbage
    collection freed it (the parent frees it afterwards)."""
    read, write = os.pipe()
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # the cycle stays garbage until the child collects
    try:
        first, second = _Cycle(write), _Cycle(write)
        first.partner, second.partner = second, first
        del first, second
        pid = os.fork()
        if pid == 0:  # the child: collect, then leave at once (no pytest teardown here)
            gc.enable()
            gc.collect()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        os.set_blocking(read, False)
        try:
            written = os.read(read, 1024)
        except BlockingIOError:
            written = b""
    finally:
        if enabled:
            gc.enable()
        gc.collect()  # here, the cycle is freed by the parent
        os.close(read)
        os.close(write)
    return COLLECTED in written


def test_a_child_of_a_process_using_cuda_frees_no_inherited_garbage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not _collected_in_child()


def test_a_child_of_a_process_without_cuda_collects_as_usual() -> None:
    assert not torch.cuda.is_initialized()
    assert _collected_in_child()

"""The local engine's worker processes: spawned (or forked, for a dataset that cannot be
pickled: :mod:`._fork`), fed chunks of items over pipes, handing pixels back through
shared-memory slots, and kept between jobs when spawned (:func:`lend_pool`).

Why not ``ProcessPoolExecutor``: its queues hold named POSIX semaphores (``sem.mp-*`` in
``/dev/shm``) that a ``kill -9`` of the process group leaks, and it pickles every decoded
image through a pipe to the parent. Here each worker has one socket pair; the fixed-size
pixel fields of raw storage go into a ring of slots in one anonymous shared file (a
``memfd``: nothing to leak), which the parent's shard writer copies from once. Workers
exit when the parent dies (``PR_SET_PDEATHSIG`` on Linux, a parent-pid watchdog
elsewhere), so an OOM-killed job leaves no process behind.

Starting a worker (a Python process importing NumPy, OpenCV and PIL) costs about as much
as decoding a few hundred images, so the workers of a finished job stay, idle, for the
next job of this thread with the same worker count, working directory and ``sys.path``;
they exit after :data:`IDLE_EXIT_S` without one.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import itertools
import math
import mmap
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from types import FrameType
from typing import Any

import cv2
import numpy as np

from fastdata.errors import PreprocessError
from fastdata.preprocess._fork import single_threaded_torch
from fastdata.preprocess._sources import SourceItem
from fastdata.preprocess._task import SampleFailure, SampleResult, ShardJob, process_sample
from fastdata.shards import FieldSpec

CHUNK_ITEMS = 16
# In flight per worker: enough for the workers to go on while the parent closes a shard
# (fsync, checksum), bounded by the shared memory the slots take.
_CHUNKS_PER_WORKER = 8
_MIN_CHUNKS_PER_WORKER = 2
_MAX_SLOT_MEMORY_BYTES = 64 << 20
_MIN_SLOT_FIELD_BYTES = 4096  # smaller arrays (labels) travel with the results
_WATCHDOG_PERIOD_S = 0.5
_JOIN_TIMEOUT_S = 5.0
IDLE_EXIT_S = 60.0
_PR_SET_PDEATHSIG = 1


class _Slotted:
    """Stands for an array the worker wrote into the sample's slot."""

    __slots__ = ()


_SLOTTED = _Slotted()


def slot_fields(job: ShardJob) -> list[tuple[FieldSpec, int]]:
    """The fixed-size array fields passed through slots, each with its offset in a slot."""
    fields = []
    offset = 0
    for spec in job.fields:
        if spec.sample_nbytes >= _MIN_SLOT_FIELD_BYTES:  # fixed-size fields only
            fields.append((spec, offset))
            offset += -(-spec.sample_nbytes // 64) * 64  # cache-line aligned
    return fields


def _slot_bytes(fields: list[tuple[FieldSpec, int]]) -> int:
    if not fields:
        return 0
    spec, offset = fields[-1]
    return offset + -(-spec.sample_nbytes // 64) * 64


def _view(buffer: mmap.mmap, spec: FieldSpec, offset: int) -> np.ndarray:
    count = math.prod(spec.shape)  # per sample: no NumPy call overhead
    return np.frombuffer(buffer, spec.dtype, count, offset).reshape(spec.shape)


def _anonymous_file(nbytes: int) -> int:
    """A file descriptor of ``nbytes`` of shared memory that has no name to leak."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("fastdata-preprocess-slots", os.MFD_CLOEXEC)
    else:  # an unlinked temporary file: gone when the last descriptor closes
        with tempfile.TemporaryFile() as handle:
            fd = os.dup(handle.fileno())
    os.ftruncate(fd, nbytes)
    return fd


def _die_with_parent(parent_pid: int) -> None:
    """Exit as soon as the process that started this one is gone (even by ``kill -9``)."""
    if sys.platform.startswith("linux"):
        # without prctl (an unusual libc) the watchdog below is the only guard
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # died before the signal was armed
        os._exit(1)

    def watch() -> None:  # where there is no parent-death signal (and as a second guard)
        while os.getppid() == parent_pid:
            time.sleep(_WATCHDOG_PERIOD_S)
        os._exit(1)

    threading.Thread(target=watch, name="fastdata-parent-watchdog", daemon=True).start()


def worker_main(
    conn: Connection,
    job: ShardJob,
    parent_pid: int,
    slot_bytes: int,
    inherited: Sequence[Connection] = (),
) -> None:
    """A worker's loop over the parent's messages: ``("chunk", chunk id, [(item, slot)...])``
    answered ``("done", chunk id, results)``; ``("job", pickled job, slot bytes, new
    memory)`` (the next job; the slot memory's descriptor follows when new) answered
    ``("ready", pid)``; ``("rest", seconds)`` between jobs: exit unless a job comes
    within that time; ``None`` to exit. A forked worker first closes its copies of the
    parent's ends of the pipes (``inherited``), so that a pipe's end closed by the parent
    reads as closed."""
    for other in inherited:
        other.close()
    _die_with_parent(parent_pid)
    _ignore_interrupts()
    cv2.setNumThreads(1)  # the workers are the parallelism; OpenCV's threads oversubscribe
    single_threaded_torch()
    slots = _receive_slots(conn) if slot_bytes else None
    fields = slot_fields(job)
    conn.send(("ready", os.getpid()))
    rest_s: float | None = None
    while True:
        try:
            if rest_s is not None and not conn.poll(rest_s):
                return  # no job came: give the memory back
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        reply: tuple[str, int, Any] | tuple[str, int]
        if message[0] == "rest":
            rest_s = message[1]
            continue
        if message[0] == "job":
            rest_s = None
            _, pickled, slot_bytes, new_memory = message
            if new_memory:
                if slots is not None:
                    slots.close()
                slots = _receive_slots(conn) if slot_bytes else None
            try:
                job = pickle.loads(pickled)
                fields = slot_fields(job)
                reply = ("ready", os.getpid())
            except Exception as exc:  # e.g. a module that this process cannot import
                reply = ("error", -1, _picklable(exc))
        else:
            _, chunk_id, entries = message
            try:
                reply = (
                    "done",
                    chunk_id,
                    [
                        _process(item, job, (slots, slot * slot_bytes), fields)
                        for item, slot in entries
                    ],
                )
            except Exception as exc:  # any failure: re-raised in the parent
                reply = ("error", chunk_id, _picklable(exc))
        try:
            conn.send(reply)
        except OSError:  # the parent stopped listening (job over or failed): just go
            return


def _ignore_interrupts() -> None:
    """Leave Ctrl-C to the parent: a terminal sends SIGINT to the whole process group, and
    a worker that raised ``KeyboardInterrupt`` too would print a traceback of its own; the
    parent stops the workers either way. The workers start with SIGINT blocked
    (:func:`_interrupts_blocked`), so none arrives before this point; one that is pending
    is discarded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # POSIX
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextmanager
def _interrupts_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while it starts workers, which inherit the mask: a
    spawned worker spends a second importing before :func:`_ignore_interrupts` runs. A
    Ctrl-C meanwhile reaches this process once the mask is restored (or another thread of
    it at once), so the parent misses none."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _receive_slots(conn: Connection) -> mmap.mmap:
    fd = recv_handle(conn)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


def _process(
    item: SourceItem,
    job: ShardJob,
    slot: tuple[mmap.mmap | None, int],
    fields: list[tuple[FieldSpec, int]],
) -> SampleResult:
    slots, base = slot
    if slots is None:
        return process_sample(item, job)
    views = {spec.name: _view(slots, spec, base + offset) for spec, offset in fields}
    # the resize writes straight into the slot where it can (no copy of the pixels)
    result = process_sample(item, job, views)
    if isinstance(result, SampleFailure):
        return result
    sample, stats = result
    for spec, _ in fields:
        value, view = sample.get(spec.name), views[spec.name]
        if value is view:
            sample[spec.name] = _SLOTTED
        elif (
            isinstance(value, np.ndarray)
            and value.shape == spec.shape
            and value.dtype == np.dtype(spec.dtype)
        ):
            np.copyto(view, value)
            sample[spec.name] = _SLOTTED
    return sample, stats


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.dumps(exc)
    except Exception:  # any pickling failure: send its text instead
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


# Starting workers changes process-wide state for a moment (``__main__``'s file and spec,
# OpenCV's thread count) and restores it: one thread at a time, or a second thread would
# save the first one's temporary values and restore those. Closing a pool's pipe ends holds
# it too: a worker forked while another thread is inside ``Connection.close()`` (descriptor
# closed, handle not yet cleared) would close that descriptor again, or whatever file has
# taken its number since. Reentrant: a pool that fails to start closes itself.
_start_lock = threading.RLock()
_live_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _other_pools_ends(pool: WorkerPool) -> list[Connection]:
    """This process's ends of the pipes of every other live pool."""
    return [conn for other in list(_live_pools) if other is not pool for conn in other._conns]


@contextmanager
def _starting_workers(job: ShardJob, *, forked: bool) -> Iterator[None]:
    """Held while this thread starts a pool's worker processes (a forked one starts with
    OpenCV on one thread: :mod:`fastdata._threads`)."""
    with _start_lock, contextlib.nullcontext() if forked else _main_for_workers(job):
        yield


@contextmanager
def _main_for_workers(job: ShardJob) -> Iterator[None]:
    """Spawned children first import the parent's ``__main__`` (by file or module name),
    which re-runs a script's top level: its imports (seconds for torch or Ray), and any
    unguarded ``preprocess()`` call, which then fails in every worker. When the job does
    not refer to ``__main__``, the workers need nothing from it, so it is hidden while
    they start; when it does, the call must be guarded (checked here, with the fix)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    if b"__main__" in pickle.dumps(job):
        _check_main_is_importable(main)
        yield
        return
    saved: dict[str, Any] = {
        name: main.__dict__[name] for name in ("__file__", "__spec__") if name in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            del main.__spec__


def _check_main_is_importable(main: Any) -> None:
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is None and not (
        isinstance(path, str) and os.path.isfile(path)
    ):
        raise PreprocessError(
            f"the job refers to objects defined in __main__ ({path or 'no file'}), which "
            "worker processes cannot import: define them in a module file, or pass workers=1"
        )
    where = unguarded_main_call(main)
    if where is not None:
        raise PreprocessError(
            f"preprocess() is called at the top level of {where[0]} (line {where[1]}) without "
            '`if __name__ == "__main__":`; its worker processes import that script, which '
            "would start the job again in each of them. Put the call under `if __name__ == "
            '"__main__":` (or pass workers=1)'
        )


def unguarded_main_call(main: Any) -> tuple[str, int] | None:
    """``(script, line)`` of the top-level statement of the running ``__main__`` script
    that led to this call, when it is not inside ``if __name__ == "__main__":``."""
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    frame: FrameType | None = sys._getframe()
    while frame is not None and not (
        frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for statement in tree.body:
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            guarded = isinstance(statement, ast.If) and _is_main_test(statement.test)
            return None if guarded else (path, line)
    return None


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    names = {
        node.id if isinstance(node, ast.Name) else node.value
        for node in (test.left, test.comparators[0])
        if isinstance(node, (ast.Name, ast.Constant))
    }
    return isinstance(test.ops[0], ast.Eq) and names == {"__name__", "__main__"}


class WorkerPool:
    """``workers`` processes running :func:`process_sample`, one job at a time, started by
    ``start_method`` (``"spawn"``, or ``"fork"``: they inherit the job unpickled).

    :meth:`results` yields every item's result in order, keeping each worker a few
    chunks ahead. A slotted array in a yielded sample is a view of shared memory that
    stays valid until the next result is requested. :meth:`switch` hands the workers the
    next job once every result of the last one has been taken.
    """

    def __init__(self, workers: int, job: ShardJob, start_method: str = "spawn") -> None:
        self._workers = workers
        self._slots: mmap.mmap | None = None
        self._conns: list[Connection] = []
        self._processes: list[Any] = []
        self._in_flight = 0  # chunks sent and not yet answered
        _live_pools.add(self)
        self._lay_out(job)
        context: Any = multiprocessing.get_context(start_method)  # Process, Pipe of either kind
        forked = start_method == "fork"
        fd = -1
        try:
            if self._slot_bytes:
                fd = self._new_slots()
            with _starting_workers(job, forked=forked):
                for _ in range(workers):
                    parent_end, child_end = context.Pipe(duplex=True)
                    # a forked child holds copies of every pipe end this process has open:
                    # it closes them, or a pool's end closed here would not read as closed
                    inherited = (
                        [*self._conns, parent_end, *_other_pools_ends(self)] if forked else []
                    )
                    process = context.Process(
                        target=worker_main,
                        args=(child_end, job, os.getpid(), self._slot_bytes, inherited),
                        name="fastdata-preprocess",
                        daemon=True,
                    )
                    with _interrupts_blocked():
                        process.start()
                    child_end.close()
                    self._conns.append(parent_end)
                    self._processes.append(process)
                    if fd >= 0:
                        send_handle(parent_end, fd, process.pid)
            for conn, process in zip(self._conns, self._processes, strict=True):
                self._receive(conn, process, "while starting")
        except BaseException:
            self.close()
            raise
        finally:
            if fd >= 0:
                os.close(fd)

    def _lay_out(self, job: ShardJob) -> None:
        """The slots of ``job``: which fields, their size, and how many chunks go ahead."""
        self._job = job
        self._fields = slot_fields(job)
        self._slot_bytes = _slot_bytes(self._fields)
        per_worker = _CHUNKS_PER_WORKER
        if self._slot_bytes:
            affordable = _MAX_SLOT_MEMORY_BYTES // (self._slot_bytes * CHUNK_ITEMS * self._workers)
            per_worker = max(_MIN_CHUNKS_PER_WORKER, min(per_worker, affordable))
        self._chunks_per_worker = per_worker
        self._num_slots = self._workers * per_worker * CHUNK_ITEMS

    def _new_slots(self) -> int:
        """Map fresh slot memory for the layout; returns its descriptor, for the workers."""
        self._free_slots()
        fd = _anonymous_file(self._slot_bytes * self._num_slots)
        try:
            self._slots = mmap.mmap(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _free_slots(self) -> None:
        if self._slots is not None:
            with suppress(BufferError):  # a sample view still alive: unmapped when collected
                self._slots.close()
            self._slots = None

    @property
    def idle(self) -> bool:
        """Every worker is alive and no chunk is in flight (the pool can take a job)."""
        return self._in_flight == 0 and all(p.is_alive() for p in self._processes)

    def switch(self, job: ShardJob) -> None:
        """Hand the idle workers the next job (pickled once for all of them).

        Raises:
            PreprocessError: A worker is gone or cannot load the job.
        """
        pickled = pickle.dumps(job)
        old_bytes = self._slot_bytes * self._num_slots
        self._lay_out(job)
        new_memory = self._slot_bytes * self._num_slots != old_bytes
        fd = -1
        if new_memory:
            if self._slot_bytes:
                fd = self._new_slots()
            else:
                self._free_slots()
        try:
            for conn, process in zip(self._conns, self._processes, strict=True):
                try:
                    conn.send(("job", pickled, self._slot_bytes, new_memory))
                    if fd >= 0:
                        send_handle(conn, fd, process.pid)
                except OSError:
                    raise _died(process, "between jobs") from None
            for conn, process in zip(self._conns, self._processes, strict=True):
                message = self._receive(conn, process, "between jobs")
                if message[0] == "error":
                    raise PreprocessError(f"a preprocess worker cannot load the job: {message[2]}")
        finally:
            if fd >= 0:
                os.close(fd)

    def rest(self) -> None:
        """Tell the workers that the job is over: they exit after :data:`IDLE_EXIT_S`
        unless another job comes."""
        for conn in self._conns:
            conn.send(("rest", IDLE_EXIT_S))

    def _receive(self, conn: Connection, process: Any, doing: str) -> Any:
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise _died(process, doing) from None

    def results(
        self, items: Iterable[SourceItem], num_items: int, advance: Callable[[int], None]
    ) -> Iterator[SampleResult]:
        """The result of each of the ``num_items`` ``items``, in order; ``items`` is read
        a chunk at a time, as chunks go out (a dataset's items are made then)."""
        source = iter(items)
        num_chunks = -(-num_items // CHUNK_ITEMS)
        idle: deque[int] = deque(
            w for _ in range(self._chunks_per_worker) for w in range(len(self._conns))
        )
        busy: dict[int, int] = {}  # connection index -> chunks in flight
        done: dict[int, list[SampleResult]] = {}
        sent = 0
        for chunk_id in range(num_chunks):
            while chunk_id not in done:
                # item i uses slot i mod num_slots; it is free once item i - num_slots is
                # consumed, i.e. the chunk may go out once its last item is in reach
                while (
                    idle
                    and sent < num_chunks
                    and ((sent + 1) * CHUNK_ITEMS <= chunk_id * CHUNK_ITEMS + self._num_slots)
                ):
                    worker = idle.popleft()
                    start = sent * CHUNK_ITEMS
                    chunk = itertools.islice(source, CHUNK_ITEMS)
                    slots = ((start + k) % self._num_slots for k in itertools.count())
                    entries = list(zip(chunk, slots, strict=False))
                    try:
                        self._conns[worker].send(("chunk", sent, entries))
                    except OSError:
                        raise _died(self._processes[worker], "while processing images") from None
                    self._in_flight += 1
                    busy[worker] = busy.get(worker, 0) + 1
                    sent += 1
                self._collect(done, idle, busy)
            results = done.pop(chunk_id)
            advance(len(results))
            for k, result in enumerate(results):
                yield self._attach(result, (chunk_id * CHUNK_ITEMS + k) % self._num_slots)

    def _collect(
        self, done: dict[int, list[SampleResult]], idle: deque[int], busy: dict[int, int]
    ) -> None:
        """Receive at least one message from the workers with chunks in flight."""
        ready = wait([conn for i, conn in enumerate(self._conns) if busy.get(i)])
        for conn in ready:
            index = next(i for i, c in enumerate(self._conns) if c is conn)
            message = self._receive(
                self._conns[index], self._processes[index], "while processing images"
            )
            kind, chunk_id = message[0], message[1]
            if kind == "error":
                raise message[2]
            self._in_flight -= 1
            done[chunk_id] = message[2]
            busy[index] -= 1
            idle.append(index)

    def _attach(self, result: SampleResult, slot: int) -> SampleResult:
        if isinstance(result, SampleFailure):
            return result
        sample, stats = result
        if self._slots is None:
            return sample, stats
        base = slot * self._slot_bytes
        for spec, offset in self._fields:
            if isinstance(sample.get(spec.name), _Slotted):
                sample[spec.name] = _view(self._slots, spec, base + offset)
        return sample, stats

    def close(self) -> None:
        """Stop the workers (they finish the chunk in hand) and free the shared memory."""
        with _start_lock:
            conns, self._conns = self._conns, []
            for conn in conns:
                with suppress(OSError):
                    conn.send(None)
                conn.close()  # a worker blocked sending a result gets an error and exits
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        self._processes = []
        self._free_slots()


# The pool a finished job left for the next one:
# (owner pid, owner thread, start method, workers, cwd, sys.path), pool.
_idle_pool: list[tuple[tuple[Any, ...], WorkerPool]] = []
_idle_lock = threading.Lock()


def _storage_environment() -> tuple[tuple[str, str], ...]:
    """The environment object-store clients read when a worker creates one (endpoint,
    credentials, retries): a kept worker started under another would read another store."""
    prefixes = ("AWS_", "GOOGLE_", "FASTDATA_STORAGE_")
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))


@contextmanager
def lend_pool(workers: int, job: ShardJob, start_method: str) -> Iterator[WorkerPool]:
    """A pool of ``workers`` processes started by ``start_method`` and set up for ``job``:
    the one an earlier job of this thread left idle when it fits, else a new one. It stays
    for the next job when this one takes every result; an error or an early stop closes it.

    A pool fits when this thread of this process started it the same way (its workers end
    with that thread: Linux's parent-death signal follows the thread that started them),
    with the same worker count, working directory (relative input paths), ``sys.path`` and
    object-store environment (``AWS_*``...: inputs read from a store by URL).
    A job that runs user code (a dataset object: ``job.loader``) gets a pool of its own,
    closed after it: a kept worker would run the version of that code it loaded first, not
    an edited one, and a spawned worker cannot load ``__main__``'s (see
    :func:`_main_for_workers`).
    """
    key = (os.getpid(), threading.get_ident(), start_method, workers, os.getcwd(), tuple(sys.path),
           _storage_environment())  # fmt: skip
    if job.loader is not None:
        own_pool = WorkerPool(workers, job, start_method)
        try:
            yield own_pool
        finally:
            own_pool.close()
        return
    pool = _take_idle_pool(key)
    if pool is not None:
        try:
            pool.switch(job)
        except PreprocessError:  # gone meanwhile (idle too long), or cannot load the job
            pool.close()
            pool = None
        except BaseException:
            pool.close()
            raise
    if pool is None:
        pool = WorkerPool(workers, job, start_method)
    try:
        yield pool
    except BaseException:
        pool.close()
        raise
    if not pool.idle:
        pool.close()
        return
    try:
        pool.rest()
    except OSError:
        pool.close()
        return
    with _idle_lock:
        _idle_pool.append((key, pool))
        spare = _idle_pool.pop(0) if len(_idle_pool) > 1 else None
    if spare is not None:
        spare[1].close()


def close_idle_pools() -> None:
    """Stop the workers earlier jobs of this process left idle (they would exit by
    themselves a minute after the last job); the next job starts new ones."""
    with _idle_lock:
        idle = list(_idle_pool)
        _idle_pool.clear()
    for (owner, *_), pool in idle:
        if owner == os.getpid():  # a forked copy of another process's pool is not ours
            pool.close()


def _take_idle_pool(key: tuple[Any, ...]) -> WorkerPool | None:
    with _idle_lock:
        if not _idle_pool:
            return None
        found, pool = _idle_pool.pop()
    if found[0] != key[0]:  # a forked copy of another process's pool: not ours to stop
        return None
    if found == key and pool.idle:
        return pool
    pool.close()
    return None


def _died(process: Any, doing: str) -> PreprocessError:
    process.join(_JOIN_TIMEOUT_S)
    return PreprocessError(
        f"a preprocess worker process (pid {process.pid}) exited with code "
        f"{process.exitcode} {doing}; its error, if any, is printed above. "
        "Out of memory is a common cause (fewer workers need less)"
        + (_STARTUP_HINT if doing == "while starting" else "")
    )


_STARTUP_HINT = (
    ". Workers are spawned processes: they must be able to import everything the job refers "
    "to (an object defined in a notebook or in `python -` cannot be: define it in a module), "
    "and a script that defines such objects must call preprocess() under `if __name__ == "
    '"__main__":`'
)

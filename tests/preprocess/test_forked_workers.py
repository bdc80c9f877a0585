"""Datasets that cannot be pickled: forked workers inherit them (Linux), or, where forking is
not safe, this process reads them with a warning naming the reason and the fix.

Each dataset records the pid of every process that reads an item in a folder, so a test
can see which processes did the work.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import cv2
import h5py
import numpy as np
import pytest

from fastdata import PreprocessOptions, load_manifest
from fastdata.cli import main
from fastdata.errors import PreprocessError
from fastdata.preprocess import _fork, _pool, preprocess
from fastdata.preprocess import engine as engine_module
from fastdata.preprocess.engine import LocalEngine, ShardJob, ShardResult
from fastdata.shards import ShardReader
from tests.preprocess.conftest import alive, idle_worker_pids, shard_bytes

REPO = Path(__file__).resolve().parents[2]
N = 40  # three chunks of items: both workers get some
SIDE = 8
# 8 samples per shard (8x8x3 pixels, a label, ~64 bytes of path): 5 shards of 40.
OPTIONS = PreprocessOptions(sizes=(SIDE,), shard_bytes=8 * (SIDE * SIDE * 3 + 8 + 64))

needs_fork = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="forked workers are used on Linux only"
)


def pixels(index: int) -> np.ndarray:
    height, width = 16 + index % 7, 20 + index % 5
    return np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)


class H5Images:
    """Images in an HDF5 file, one dataset per item, read through an h5py handle.

    ``keep_open`` opens the file in ``__init__`` and keeps the handle when pickled, which
    h5py refuses; otherwise the file is opened in ``__getitem__`` and the handle left out
    of the pickle (the fix the warning recommends). Items that ``bad`` names raise.
    """

    def __init__(
        self, path: Path, record: Path, *, keep_open: bool, bad: dict[int, Exception] | None = None
    ) -> None:
        self.path = path
        self.record = record
        self.keep_open = keep_open
        self.bad = bad or {}
        self.handle = h5py.File(path, "r") if keep_open else None

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        self.record.mkdir(exist_ok=True)
        (self.record / str(os.getpid())).touch()
        if index in self.bad:
            raise self.bad[index]
        if self.handle is None:
            self.handle = h5py.File(self.path, "r")
        return self.handle[str(index)][()], index % 3

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ if self.keep_open else {**self.__dict__, "handle": None}


@pytest.fixture
def images(tmp_path: Path) -> Path:
    path = tmp_path / "images.h5"
    with h5py.File(path, "w") as handle:
        for index in range(N):
            handle[str(index)] = pixels(index)
    return path


def _readers(record: Path) -> set[int]:
    """The processes other than this one that read items."""
    return {int(p.name) for p in record.iterdir()} - {os.getpid()}


def _run(
    dataset: Any,
    out: Path,
    workers: int | None = None,
    options: PreprocessOptions = OPTIONS,
    engine: LocalEngine | None = None,
) -> Any:
    return preprocess(dataset, out, options, workers=workers, engine=engine, show_progress=False)


@needs_fork
def test_forked_workers_read_it_and_write_the_bytes_of_pickled_and_single_runs(
    tmp_path: Path, images: Path, caplog: pytest.LogCaptureFixture
) -> None:
    eager = H5Images(images, tmp_path / "forked", keep_open=True)
    with caplog.at_level(logging.INFO, logger="fastdata.preprocess"):
        summary = _run(eager, tmp_path / "a", workers=2)  # forked: the default here
    assert "read in this process only" not in caplog.text
    assert (summary.num_samples, summary.num_shards) == (N, 5)
    assert len(_readers(tmp_path / "forked")) == 2
    # an engine told to spawn is not overruled: it refuses, naming why
    spawning = LocalEngine(2, start_method="spawn")
    with pytest.raises(
        PreprocessError,
        match=r"LocalEngine\(start_method='spawn'\) sends the dataset to its worker processes, "
        r"but it cannot be pickled \(TypeError: h5py objects cannot be pickled\)",
    ):
        _run(
            H5Images(images, tmp_path / "forked2", keep_open=True), tmp_path / "a2", engine=spawning
        )
    assert _readers(tmp_path / "forked2") == set() and not (tmp_path / "a2").exists()
    spawned = H5Images(images, tmp_path / "pickled", keep_open=False)
    _run(spawned, tmp_path / "b", engine=LocalEngine(2, start_method="spawn"))
    assert len(_readers(tmp_path / "pickled")) == 2  # spawned workers that unpickled it
    _run(H5Images(images, tmp_path / "single", keep_open=True), tmp_path / "c", workers=1)
    assert _readers(tmp_path / "single") == set()
    assert len(shard_bytes(tmp_path / "a")) == 5
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b") == shard_bytes(tmp_path / "c")
    manifests = [load_manifest(tmp_path / name) for name in "abc"]
    assert manifests[0].stats == manifests[1].stats == manifests[2].stats


@pytest.mark.parametrize(
    "unsafe",
    [
        ("cuda", "and CUDA is initialised in this process, and forked processes cannot use it"),
        ("platform", "and this platform .* cannot fork processes"),
    ],
)
def test_where_forking_is_unsafe_this_process_reads_it_with_a_warning(
    tmp_path: Path,
    images: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unsafe: tuple[str, str],
) -> None:
    patch, reason = unsafe
    if patch == "cuda":
        monkeypatch.setattr(_fork, "cuda_is_initialised", lambda: True)
    else:
        monkeypatch.setattr(_fork.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    record = tmp_path / "record"
    with caplog.at_level(logging.WARNING, logger="fastdata.preprocess"):
        summary = _run(H5Images(images, record, keep_open=True), tmp_path / "o", workers=2)
    assert summary.num_samples == N and _readers(record) == set()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "the dataset is read in this process only, not by 2 worker processes: it cannot be "
        "pickled (TypeError: h5py objects cannot be pickled), "
    )
    assert re.search(reason, lines[0]), lines[0]
    assert lines[0].endswith(
        "make it picklable (e.g. open files in __getitem__, not in __init__) to read it in parallel"
    )
    _run(H5Images(images, tmp_path / "single", keep_open=True), tmp_path / "c", workers=1)
    assert shard_bytes(tmp_path / "o") == shard_bytes(tmp_path / "c")


def test_a_local_engine_refuses_to_fork_where_it_is_unsafe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(
        ValueError, match="start_method must be 'auto', 'fork' or 'spawn', got 'thread'"
    ):
        LocalEngine(2, start_method="thread")
    monkeypatch.setattr(_fork, "cuda_is_initialised", lambda: True)
    with pytest.raises(PreprocessError, match="cannot fork its worker processes: CUDA is init"):
        LocalEngine(2, start_method="fork")


@needs_fork
def test_bad_items_in_forked_workers_follow_on_error(tmp_path: Path, images: Path) -> None:
    unreadable = {30: OSError("corrupt image")}
    summary = _run(
        H5Images(images, tmp_path / "r", keep_open=True, bad=unreadable), tmp_path / "o", 2
    )
    assert (summary.num_samples, summary.num_skipped) == (N - 1, 1)
    assert load_manifest(tmp_path / "o").skipped[0]["path"] == "dataset[30]"
    assert len(_readers(tmp_path / "r")) == 2
    broken = H5Images(images, tmp_path / "r", keep_open=True, bad={30: KeyError("gone")})
    with pytest.raises(PreprocessError, match=r"dataset\[30\] raised KeyError: 'gone'"):
        _run(broken, tmp_path / "f", workers=2)
    assert not (tmp_path / "f" / "index.json").exists()


class LargeNoise:
    """Holds a lock (it cannot be pickled); 512x512 noise, whose JPEGs at quality 100 fill
    a pipe: a worker blocks sending them once the parent stops reading."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if index == 20:
            raise KeyError("gone")
        return np.random.default_rng(index).integers(0, 256, (512, 512, 3), np.uint8), 0


@needs_fork
def test_forked_workers_exit_by_themselves_when_the_job_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker blocked sending results must see the parent close its end of the pipe,
    which it does not while it holds a copy of that end (inherited by the fork)."""
    exit_codes: list[int | None] = []
    original_close = _pool.WorkerPool.close

    def close(self: Any) -> None:
        processes = list(self._processes)
        original_close(self)
        exit_codes.extend(process.exitcode for process in processes)

    monkeypatch.setattr(_pool.WorkerPool, "close", close)
    options = PreprocessOptions(sizes=(512,), storage="jpeg", jpeg_quality=100)
    with pytest.raises(PreprocessError, match=r"dataset\[20\] raised KeyError: 'gone'"):
        _run(LargeNoise(), tmp_path / "o", workers=2, options=options)
    assert exit_codes == [0, 0]  # not killed after the join timeout


def _crash_after(shards: int) -> Any:
    original_run = engine_module.LocalEngine.run

    def run(self: Any, tasks: Any, job: Any, advance: Any) -> Iterator[ShardResult]:
        assert _fork.resolve_start_method(self.start_method) == "fork"
        for count, result in enumerate(original_run(self, tasks, job, advance), start=1):
            yield result
            if count == shards:
                raise KeyboardInterrupt

    return run


@needs_fork
def test_forked_job_resumes_after_a_crash(
    tmp_path: Path, images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(engine_module.LocalEngine, "run", _crash_after(2))
        with pytest.raises(KeyboardInterrupt):
            _run(H5Images(images, tmp_path / "r", keep_open=True), tmp_path / "o", workers=2)
    assert sorted(shard_bytes(tmp_path / "o")) == ["shard-00000.h5", "shard-00001.h5"]
    summary = _run(H5Images(images, tmp_path / "r", keep_open=True), tmp_path / "o", workers=2)
    assert (summary.num_reused_shards, summary.num_processed) == (2, N - 16)
    _run(H5Images(images, tmp_path / "r", keep_open=True), tmp_path / "clean", workers=1)
    assert shard_bytes(tmp_path / "o") == shard_bytes(tmp_path / "clean")


@needs_fork
def test_stdin_script_whose_parent_runs_opencv_and_torch_threads(tmp_path: Path) -> None:
    """Workers forked just after this process ran OpenCV's and torch's thread pools (a
    child that then resizes OpenCV's pool, or runs torch on the inherited pool, hangs),
    for a class defined in ``python -`` and a call without a ``__main__`` guard."""
    script = textwrap.dedent(f"""
        import os
        import cv2
        import numpy as np
        import torch
        from fastdata.preprocess import PreprocessOptions, preprocess

        PARENT = os.getpid()
        BIG = np.zeros((2000, 2000, 3), np.uint8)

        class Stdin:
            def __len__(self):
                return 40

            def __getitem__(self, index):
                with open(os.path.join({str(tmp_path)!r}, str(os.getpid())), "w"):
                    pass
                if os.getpid() == PARENT:  # listing: the pools run just before the fork
                    for _ in range(5):
                        cv2.resize(BIG, (700, 333), interpolation=cv2.INTER_AREA)
                    torch.ones(512, 512) @ torch.ones(512, 512)
                image = torch.full((3, 20, 24), index, dtype=torch.uint8)
                return (image.float() @ torch.eye(24)).to(torch.uint8), index

        summary = preprocess(Stdin(), {str(tmp_path / "o")!r}, PreprocessOptions(sizes=(8,)),
                             workers=2, show_progress=False)
        print("samples", summary.num_samples)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-"],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,  # a hung worker hangs the job
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "samples 40" in done.stdout
    assert done.stderr == ""  # no warning: the workers read it
    readers = {int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()}
    assert len(readers) == 3  # the parent (listing) and two workers


_MODULE = '''
import os
import time
from pathlib import Path

import numpy as np


class OpenFile:
    """Holds an open file, so it cannot be pickled."""

    def __init__(self):
        self.handle = open(__file__, "rb")

    def __len__(self):
        return 40

    def __getitem__(self, index):
        (Path(__file__).parent / "pids" / str(os.getpid())).touch()
        time.sleep(float(os.environ.get("ITEM_DELAY_S", "0")))
        return np.full((20, 24, 3), index * 5, np.uint8), index % 2


data = OpenFile()
'''


@needs_fork
def test_cli_from_python_forks_then_resumes_after_kill_9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pids").mkdir()
    (tmp_path / "unpicklable_data.py").write_text(_MODULE)
    spec = f"{tmp_path / 'unpicklable_data.py'}:data"
    options = ["--size", "8", "--shard-mb", "0.002", "-q"]
    job = ["preprocess", "--from-python", spec, str(tmp_path / "o"), *options, "--workers", "2"]
    command = [sys.executable, "-m", "fastdata", *job]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ITEM_DELAY_S": "0.05"}
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        journal = tmp_path / "o" / ".fastdata-job"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(journal.glob("shard-*.json"))) < 2:
            time.sleep(0.01)
        process.kill()  # the parent alone: its forked workers must not outlive it
        process.wait()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert not (tmp_path / "o" / "index.json").exists(), "the run finished before the kill"
    workers = {int(p.name) for p in (tmp_path / "pids").iterdir()} - {process.pid}
    assert len(workers) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in workers):
        time.sleep(0.05)
    assert not [p for p in workers if alive(p)], "workers outlived the parent"
    env["ITEM_DELAY_S"] = "0"
    assert subprocess.run(command, env=env, check=False).returncode == 0
    assert (
        main(
            [
                "preprocess",
                "--from-python",
                spec,
                str(tmp_path / "clean"),
                *options,
                "--workers",
                "1",
            ]
        )
        == 0
    )
    sys.modules["unpicklable_data"].data.handle.close()  # the module this process imported
    monkeypatch.delitem(sys.modules, "unpicklable_data")
    assert shard_bytes(tmp_path / "o") == shard_bytes(tmp_path / "clean")
    assert len(ShardReader(tmp_path / "o")) == 40


@needs_fork
def test_a_dataset_class_defined_in_a_notebook_is_read_by_forked_workers(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    record = tmp_path / "pids"
    record.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(REPO)!r})"),
        nbformat.v4.new_code_cell(
            textwrap.dedent(f"""
                import os
                import numpy as np
                from fastdata.preprocess import PreprocessOptions, preprocess

                class Notebook:
                    def __len__(self):
                        return 40

                    def __getitem__(self, index):
                        open(os.path.join({str(record)!r}, str(os.getpid())), "w").close()
                        return np.full((20, 24, 3), index, np.uint8), index % 2

                summary = preprocess(Notebook(), {str(tmp_path / "o")!r},
                                     PreprocessOptions(sizes=(8,)), workers=2)
                print(summary.num_samples, os.getpid())
            """)
        ),
    ]
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    outputs = notebook.cells[1].outputs
    printed = [o.get("text", "").strip() for o in outputs if o.get("name") == "stdout"]
    assert len(printed) == 1 and printed[0].startswith("40 "), outputs
    assert not [o for o in outputs if "read in this process only" in str(o)], outputs
    kernel = int(printed[0].split()[1])
    assert len({int(p.name) for p in record.iterdir()} - {kernel}) == 2
    assert len(ShardReader(tmp_path / "o")) == 40


@pytest.mark.skipif(sys.platform != "linux", reason="forks by default on Linux only")
def test_file_jobs_fork_their_workers_where_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked worker starts without importing anything; a spawned one runs
    ``multiprocessing.spawn`` and imports OpenCV and NumPy first."""
    src = tmp_path / "src" / "class_a"
    src.mkdir(parents=True)
    for k in range(2 * _pool.CHUNK_ITEMS + 1):  # enough for two workers
        cv2.imwrite(str(src / f"{k}.png"), np.full((20, 24, 3), k % 256, np.uint8))
    options = PreprocessOptions(sizes=(8,))

    def worker_cmdlines() -> list[bytes]:
        return [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in idle_worker_pids()]

    _pool.close_idle_pools()
    preprocess(tmp_path / "src", tmp_path / "forked", options, workers=2, show_progress=False)
    forked = worker_cmdlines()
    assert len(forked) == 2 and not any(b"spawn_main" in c for c in forked)
    _pool.close_idle_pools()
    monkeypatch.setattr(_fork, "fork_refusal", lambda: "a reason")
    preprocess(tmp_path / "src", tmp_path / "spawned", options, workers=2, show_progress=False)
    spawned = worker_cmdlines()
    assert len(spawned) == 2 and all(b"spawn_main" in c for c in spawned)
    _pool.close_idle_pools()
    assert shard_bytes(tmp_path / "forked") == shard_bytes(tmp_path / "spawned")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_forked_workers_hold_no_pipe_end_of_another_pool(one_image_job: ShardJob) -> None:
    """A worker holding another pool's end of a pipe keeps it open after that pool closes
    it: that pool's workers would never see it closed."""
    job = one_image_job

    def sockets(pid: int) -> set[str]:
        fds = Path(f"/proc/{pid}/fd")
        return {os.readlink(fd) for fd in fds.iterdir() if os.readlink(fd).startswith("socket:")}

    first = _pool.WorkerPool(2, job, "fork")
    second = _pool.WorkerPool(2, job, "fork")
    try:
        first_ends = {f"socket:[{os.fstat(conn.fileno()).st_ino}]" for conn in first._conns}
        for process in second._processes:
            assert not sockets(process.pid) & first_ends
    finally:
        second.close()
        first.close()


def test_a_pool_forked_while_another_thread_closes_a_pool_starts(
    one_image_job: ShardJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker forked while another thread is inside ``Connection.close()`` (its
    descriptor closed, its handle not yet cleared) closed that descriptor again and died
    with EBADF (or closed a file that had since taken the number). The window is held open
    here: closing waits for the fork, which must wait for the close instead."""
    job = one_image_job
    first = _pool.WorkerPool(1, job, "fork")
    in_window, forked = threading.Event(), threading.Event()
    close_fd = Connection._close  # type: ignore[attr-defined]

    def close_then_wait(conn: Connection, _close: Any = close_fd) -> None:
        _close(conn)  # the descriptor is closed; close() clears the handle after this
        if threading.current_thread() is not threading.main_thread():
            in_window.set()
            forked.wait(3)  # with the fix, the fork waits for this close (3 s) instead

    monkeypatch.setattr(Connection, "_close", close_then_wait)
    closer = threading.Thread(target=first.close)
    closer.start()
    try:
        assert in_window.wait(30)
        second = _pool.WorkerPool(1, job, "fork")  # forks while (or after) `first` closes
        forked.set()
        second.close()
    finally:
        forked.set()
        closer.join(30)

"""The local engine's workers: a light start (no h5py, tqdm or Ray), kept for the next job
of the process where they fit (byte-identical output), closed after a failed job, gone
after a while without a job."""

from __future__ import annotations

import importlib
import importlib.util
import json
import mmap
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata import load_manifest
from fastdata.errors import PreprocessError
from fastdata.preprocess import PreprocessOptions, _pool, preprocess
from fastdata.preprocess import engine as engine_module
from fastdata.preprocess._sources import list_source
from fastdata.preprocess._task import SampleFailure, build_fields, process_sample
from fastdata.preprocess.engine import ShardJob
from fastdata.shards import ShardReader
from tests.preprocess.conftest import alive, idle_worker_pids, shard_bytes

REPO = Path(__file__).resolve().parents[2]


def _run(src: Path, out: Path, options: PreprocessOptions, workers: int = 2) -> None:
    preprocess(src, out, options, workers=workers, show_progress=False)


def test_the_next_job_reuses_the_workers_and_writes_the_same_bytes(
    sample_imagefolder: Path, tmp_path: Path
) -> None:
    options = PreprocessOptions(sizes=(16,), shard_bytes=7 * 16 * 16 * 3)  # 4 shards
    _run(sample_imagefolder, tmp_path / "first", options)
    workers = idle_worker_pids()
    assert len(workers) == 2
    # a job of another layout in between: other slot memory, encoded fields
    other = PreprocessOptions(sizes=(24, 16), storage="jpeg")
    _run(sample_imagefolder, tmp_path / "other", other)
    assert idle_worker_pids() == workers
    _run(sample_imagefolder, tmp_path / "again", options)
    assert idle_worker_pids() == workers
    _run(sample_imagefolder, tmp_path / "alone", options, workers=1)  # no pool at all
    expected = shard_bytes(tmp_path / "alone")
    assert len(expected) == 4
    assert shard_bytes(tmp_path / "first") == expected
    assert shard_bytes(tmp_path / "again") == expected
    # the statistics travel from the workers as tuples of floats: exactly the same sums
    assert load_manifest(tmp_path / "first").stats == load_manifest(tmp_path / "alone").stats
    _run(sample_imagefolder, tmp_path / "other-alone", other, workers=1)
    assert shard_bytes(tmp_path / "other") == shard_bytes(tmp_path / "other-alone")


def test_a_failed_job_closes_its_workers(sample_imagefolder: Path, tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(16,))
    _run(sample_imagefolder, tmp_path / "warm", options)
    before = idle_worker_pids()
    (sample_imagefolder / "class_000" / "broken.jpg").write_bytes(b"not a jpeg")
    failing = PreprocessOptions(sizes=(16,), on_error="raise")
    with pytest.raises(PreprocessError, match=r"broken\.jpg"):
        _run(sample_imagefolder, tmp_path / "fails", failing)
    assert idle_worker_pids() == []
    assert not [pid for pid in before if alive(pid)]
    _run(sample_imagefolder, tmp_path / "after", options)
    assert set(idle_worker_pids()).isdisjoint(before)


def test_idle_workers_exit_and_the_next_job_starts_new_ones(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pool, "IDLE_EXIT_S", 0.2)
    options = PreprocessOptions(sizes=(16,))
    _run(sample_imagefolder, tmp_path / "first", options)
    workers = idle_worker_pids()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)]
    _run(sample_imagefolder, tmp_path / "second", options)
    assert set(idle_worker_pids()).isdisjoint(workers)
    assert shard_bytes(tmp_path / "second") == shard_bytes(tmp_path / "first")


def test_another_working_directory_gets_new_workers(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers resolve relative paths in the directory they started in."""
    options = PreprocessOptions(sizes=(16,))
    _run(sample_imagefolder, tmp_path / "first", options)
    workers = idle_worker_pids()
    monkeypatch.chdir(sample_imagefolder.parent)
    _run(Path(sample_imagefolder.name), tmp_path / "relative", options)
    assert set(idle_worker_pids()).isdisjoint(workers)
    assert not [pid for pid in workers if alive(pid)]


def test_a_worker_imports_no_h5py_tqdm_or_ray(sample_imagefolder: Path, tmp_path: Path) -> None:
    """What a spawned worker imports to load its job: not h5py (the writer, in the parent),
    tqdm (the progress bar) or Ray; each costs every worker start a good part of its time."""
    listing = list_source(sample_imagefolder)
    options = PreprocessOptions(sizes=(16,))
    job = ShardJob(str(tmp_path / "out"), options, build_fields(listing, options), listing.kind)
    (tmp_path / "job.pickle").write_bytes(pickle.dumps(job))
    code = (
        "import json, pickle, sys\n"
        "from fastdata.preprocess._pool import worker_main\n"
        f"pickle.loads(open({str(tmp_path / 'job.pickle')!r}, 'rb').read())\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert {"cv2", "numpy", "fastdata"} <= loaded
    assert loaded.isdisjoint({"h5py", "tqdm", "ray", "torch"})


def test_close_idle_pools_stops_the_kept_workers(sample_imagefolder: Path, tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(16,))
    _run(sample_imagefolder, tmp_path / "first", options)
    kept = idle_worker_pids()
    assert kept
    _pool.close_idle_pools()
    assert idle_worker_pids() == []
    assert not [pid for pid in kept if alive(pid)]
    _run(sample_imagefolder, tmp_path / "second", options)  # starts new ones
    assert idle_worker_pids() and not set(idle_worker_pids()) & set(kept)


_EDITED_MODULE = """
import numpy as np


class Flat:
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if not 0 <= index < 8:
            raise IndexError(index)
        return np.full((16, 16, 3), {value}, np.uint8), 0
"""


def test_a_dataset_class_edited_between_jobs_is_run_as_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers kept from an earlier job hold the modules they imported then: a dataset job
    must not run a class the user has edited (and reloaded) since with the old code."""
    code = tmp_path / "code"
    code.mkdir()
    module = code / "edited_dataset.py"
    module.write_text(_EDITED_MODULE.format(value=10))
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.delitem(sys.modules, "edited_dataset", raising=False)
    edited_dataset = importlib.import_module("edited_dataset")  # a module written above

    options = PreprocessOptions(sizes=(16,))
    _run(edited_dataset.Flat(), tmp_path / "before", options)  # type: ignore[arg-type]
    module.write_text(_EDITED_MODULE.format(value=200))
    importlib.reload(edited_dataset)
    _run(edited_dataset.Flat(), tmp_path / "after", options)  # type: ignore[arg-type]
    reader = ShardReader(tmp_path / "after")
    images = [reader.read("image", i) for i in range(len(reader))]
    reader.close()
    assert len(images) == 8
    assert all(int(image.min()) == int(image.max()) == 200 for image in images)


def test_jobs_started_from_two_threads_leave_main_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Starting spawned workers hides ``__main__``'s file and spec for a moment; two
    threads doing so at once must not leave them changed for later spawns."""
    main = sys.modules["__main__"]
    # as under `python -m package.script`, whose workers import __main__ by module name
    monkeypatch.setattr(main, "__spec__", importlib.util.spec_from_loader("script", None))
    before = {name: main.__dict__.get(name, "<absent>") for name in ("__file__", "__spec__")}
    first_in, second_in = threading.Event(), threading.Event()

    def first() -> None:
        with _pool._starting_workers(object(), forked=False):  # type: ignore[arg-type]
            first_in.set()
            second_in.wait(0.5)  # the second thread starts workers meanwhile, or waits

    def second() -> None:
        first_in.wait(5)
        with _pool._starting_workers(object(), forked=False):  # type: ignore[arg-type]
            second_in.set()
            starter.join()  # still starting when the first thread is done

    starter = threading.Thread(target=first)
    other = threading.Thread(target=second)
    starter.start()
    other.start()
    starter.join()
    other.join()
    after = {name: main.__dict__.get(name, "<absent>") for name in ("__file__", "__spec__")}
    assert after == before


def test_jobs_from_two_threads_write_what_each_writes_alone(
    sample_imagefolder: Path, tmp_path: Path
) -> None:
    jobs = {
        "raw": PreprocessOptions(sizes=(16,), shard_bytes=7 * 16 * 16 * 3),
        "jpeg": PreprocessOptions(sizes=(24,), storage="jpeg", grayscale=True),
    }
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            _run(sample_imagefolder, tmp_path / f"{name}-together", jobs[name])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for name, options in jobs.items():
        _run(sample_imagefolder, tmp_path / f"{name}-alone", options, workers=1)
        assert shard_bytes(tmp_path / f"{name}-together") == shard_bytes(tmp_path / f"{name}-alone")
        together = load_manifest(tmp_path / f"{name}-together")
        assert together.stats == load_manifest(tmp_path / f"{name}-alone").stats


def test_a_job_survives_the_end_of_the_thread_that_ran_the_last_one(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers die with the thread that started them (Linux's parent-death signal follows
    the thread): a pool started by another thread must not serve this one's job."""
    options = PreprocessOptions(sizes=(16,), shard_bytes=7 * 16 * 16 * 3)  # 4 shards
    done, leave = threading.Event(), threading.Event()

    def first_job() -> None:
        _run(sample_imagefolder, tmp_path / "first", options)
        done.set()
        leave.wait(30)

    other = threading.Thread(target=first_job)
    other.start()
    assert done.wait(60)
    write_shard = engine_module.write_shard

    def write_after_the_other_thread_ends(*args: Any) -> Any:
        if other.is_alive():
            leave.set()
            other.join()
            time.sleep(0.3)  # the parent-death signal reaches its workers
        return write_shard(*args)

    monkeypatch.setattr(engine_module, "write_shard", write_after_the_other_thread_ends)
    _run(sample_imagefolder, tmp_path / "second", options)
    assert shard_bytes(tmp_path / "second") == shard_bytes(tmp_path / "first")


@pytest.mark.parametrize(
    "options",
    [
        PreprocessOptions(sizes=(40, 56)),  # shorter: written into the slots, one upscaled
        PreprocessOptions(sizes=(72,), resize="exact", grayscale=True),
        PreprocessOptions(sizes=(40,), resize="pad"),  # a new array, copied into the slot
    ],
    ids=["shorter", "exact-gray", "pad"],
)
def test_pixels_written_into_the_slots_make_the_shards_of_one_process(
    sample_imagefolder: Path, tmp_path: Path, options: PreprocessOptions
) -> None:
    _run(sample_imagefolder, tmp_path / "pool", options)
    _run(sample_imagefolder, tmp_path / "alone", options, workers=1)
    assert shard_bytes(tmp_path / "pool") == shard_bytes(tmp_path / "alone")
    assert load_manifest(tmp_path / "pool").stats == load_manifest(tmp_path / "alone").stats


def test_a_worker_resizes_straight_into_the_slot(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = list_source(sample_imagefolder)
    options = PreprocessOptions(sizes=(40, 48))  # both fields large enough for slots
    job = ShardJob(str(tmp_path), options, build_fields(listing, options), listing.kind)
    fields = _pool.slot_fields(job)
    assert [spec.name for spec, _ in fields] == ["image", "image_48"]
    slots = mmap.mmap(-1, _pool._slot_bytes(fields) * 2)
    item = listing.items[3]
    expected = process_sample(item, job)
    assert not isinstance(expected, SampleFailure)

    def no_copy(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the pixels were copied into the slot")

    monkeypatch.setattr(_pool.np, "copyto", no_copy)
    result = _pool._process(item, job, (slots, _pool._slot_bytes(fields)), fields)
    assert not isinstance(result, SampleFailure)
    sample, stats = result
    assert stats == expected[1]
    for spec, offset in fields:
        assert isinstance(sample[spec.name], _pool._Slotted)
        slot = _pool._view(slots, spec, _pool._slot_bytes(fields) + offset)
        np.testing.assert_array_equal(slot, expected[0][spec.name])

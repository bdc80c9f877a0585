"""Resumability after a crash or kill -9, and byte-for-byte determinism."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from fastdata import PreprocessOptions, load_manifest
from fastdata.errors import PreprocessError, ShardFormatError
from fastdata.preprocess import engine as engine_module
from fastdata.preprocess import preprocess
from fastdata.preprocess.engine import ShardResult
from fastdata.shards import ShardReader, verify_shards

# Three 16x16 samples per shard (pixels, label and ~64 bytes of path): 8 shards of 24.
SMALL_SHARDS = PreprocessOptions(sizes=(16,), shard_bytes=3 * (16 * 16 * 3 + 8 + 64))


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.h5"))}


def test_identical_runs_give_identical_bytes(sample_imagefolder: Path, tmp_path: Path) -> None:
    preprocess(sample_imagefolder, tmp_path / "a", SMALL_SHARDS, workers=1, show_progress=False)
    time.sleep(1.1)  # HDF5 timestamps have one-second resolution
    preprocess(sample_imagefolder, tmp_path / "b", SMALL_SHARDS, workers=2, show_progress=False)
    a, b = _shard_bytes(tmp_path / "a"), _shard_bytes(tmp_path / "b")
    assert len(a) == 8 and a == b
    manifest_a, manifest_b = load_manifest(tmp_path / "a"), load_manifest(tmp_path / "b")
    assert manifest_a.shards == manifest_b.shards and manifest_a.stats == manifest_b.stats


def _crash_after(shards: int) -> Any:
    """A LocalEngine.run that dies (as if killed) once ``shards`` shards are in place."""
    original_run = engine_module.LocalEngine.run

    def run(self: Any, tasks: Any, job: Any, advance: Any) -> Iterator[ShardResult]:
        for count, result in enumerate(original_run(self, tasks, job, advance), start=1):
            yield result
            if count == shards:
                raise KeyboardInterrupt

    return run


def test_resume_after_crash_keeps_finished_shards(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    original_run = engine_module.LocalEngine.run
    monkeypatch.setattr(engine_module.LocalEngine, "run", _crash_after(2))
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=2, show_progress=False)
    assert not (out / "index.json").exists()
    first_two = _shard_bytes(out)
    assert sorted(first_two) == ["shard-00000.h5", "shard-00001.h5"]
    (out / ".shard-00002.h5.leftover").mkdir()  # a spill folder a killed writer left behind
    monkeypatch.setattr(engine_module.LocalEngine, "run", original_run)
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert (summary.num_reused_shards, summary.num_shards, summary.num_samples) == (2, 8, 24)
    assert summary.num_processed == 18
    assert sorted(p.name for p in out.iterdir()) == ["index.json"] + [
        f"shard-{i:05d}.h5" for i in range(8)
    ]
    assert verify_shards(out, show_progress=False) == []
    clean = tmp_path / "clean"
    preprocess(sample_imagefolder, clean, SMALL_SHARDS, show_progress=False)
    assert _shard_bytes(out) == _shard_bytes(clean)
    assert load_manifest(out).stats == load_manifest(clean).stats


def test_corrupt_unfinished_shard_is_redone(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    original_run = engine_module.LocalEngine.run
    monkeypatch.setattr(engine_module.LocalEngine, "run", _crash_after(1))
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=1, show_progress=False)
    (out / "shard-00000.h5").write_bytes(b"damaged")
    monkeypatch.setattr(engine_module.LocalEngine, "run", original_run)
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert summary.num_reused_shards == 0 and summary.num_samples == 24
    assert verify_shards(out, show_progress=False) == []


def test_rerun_of_finished_job_does_nothing(sample_imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert (summary.num_reused_shards, summary.num_processed) == (8, 0)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


@pytest.mark.slow
def test_kill_9_then_rerun(tmp_path: Path, sample_tool: Any) -> None:
    src = tmp_path / "src"
    sample_tool.make_sample_dataset(src, 400, 4, image_size=(96, 72), workers=1)
    command = [
        sys.executable,
        "-m",
        "fastdata",
        "preprocess",
        str(src),
        str(tmp_path / "o"),
        "--size",
        "32",
        "--shard-mb",
        "0.06",
        "--workers",
        "2",
        "-q",
    ]
    process = subprocess.Popen(command, start_new_session=True)
    journal = tmp_path / "o" / ".fastdata-job"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(journal.glob("shard-*.json"))) < 2:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the CLI and its pool workers
    process.wait()
    assert not (tmp_path / "o" / "index.json").exists(), "the run finished before the kill"
    assert subprocess.run(command, check=False).returncode == 0
    reader = ShardReader(tmp_path / "o")
    assert len(reader) == 400
    names = [bytes(reader.read("path", i)).decode() for i in range(400)]
    assert len(set(names)) == 400 and names == sorted(names, key=lambda n: (n.split("/")[0], n))
    assert verify_shards(tmp_path / "o", show_progress=False) == []


def _replace_image(path: Path, seed: int) -> None:
    """Overwrite an input with other pixels (other size and modification time)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), pixels)


def _inputs(src: Path) -> list[Path]:
    return sorted(src.rglob("*.jpg"))


@pytest.mark.parametrize("change", ["input", "options"])
def test_reader_detects_a_set_rewritten_under_it(
    sample_imagefolder: Path, tmp_path: Path, change: str
) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    sizes = {p.name: p.stat().st_size for p in out.glob("shard-*.h5")}
    reader = ShardReader(out)
    first = reader.read("image", 0)
    options = SMALL_SHARDS
    if change == "input":
        _replace_image(_inputs(sample_imagefolder)[16], seed=1)
    else:
        options = PreprocessOptions(
            sizes=(16,), shard_bytes=SMALL_SHARDS.shard_bytes, resize="exact"
        )
    preprocess(sample_imagefolder, out, options, overwrite=True, show_progress=False)
    assert {p.name: p.stat().st_size for p in out.glob("shard-*.h5")} == sizes  # same sizes
    np.testing.assert_array_equal(reader.read("image", 0), first)  # already open: old file
    with pytest.raises(ShardFormatError, match="rewritten after the manifest was read"):
        reader.read_batch("image", [0, 16])
    assert len(ShardReader(out).read_batch("image", [0, 16])) == 2  # reopened: fine


def test_changed_input_redoes_its_shard_on_resume(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    original_run = engine_module.LocalEngine.run
    monkeypatch.setattr(engine_module.LocalEngine, "run", _crash_after(2))
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=1, show_progress=False)
    _replace_image(_inputs(sample_imagefolder)[1], seed=2)  # an input of shard 0
    monkeypatch.setattr(engine_module.LocalEngine, "run", original_run)
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert (summary.num_reused_shards, summary.num_processed) == (1, 21)
    clean = tmp_path / "clean"
    preprocess(sample_imagefolder, clean, SMALL_SHARDS, show_progress=False)
    assert _shard_bytes(out) == _shard_bytes(clean)


def test_changed_input_of_finished_set_is_refused_then_rebuilt(
    sample_imagefolder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    _replace_image(_inputs(sample_imagefolder)[16], seed=3)  # an input of shard 5
    with pytest.raises(PreprocessError, match=r"inputs of shard-00005.h5 .*changed size or mod"):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    preprocess(sample_imagefolder, out, SMALL_SHARDS, overwrite=True, show_progress=False)
    clean = tmp_path / "clean"
    preprocess(sample_imagefolder, clean, SMALL_SHARDS, show_progress=False)
    assert _shard_bytes(out) == _shard_bytes(clean)


def test_refusing_another_job_says_what_differs(sample_imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    other = PreprocessOptions(sizes=(8,), shard_bytes=SMALL_SHARDS.shard_bytes)
    with pytest.raises(PreprocessError, match=r"options differ: sizes \[16\] -> \[8\]"):
        preprocess(sample_imagefolder, out, other, show_progress=False)
    _inputs(sample_imagefolder)[5].unlink()
    with pytest.raises(PreprocessError, match="input list differs: 24 inputs then, 23 now"):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)


def test_overwrite_removes_the_manifest_before_any_shard(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    original_iterdir, original_unlink = Path.iterdir, Path.unlink
    removed: list[str] = []

    def iterdir(self: Path) -> Iterator[Path]:  # any listing order: here shards first
        return iter(sorted(original_iterdir(self), reverse=True))

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name.startswith("shard-") and len(removed) == 1:
            raise KeyboardInterrupt  # killed while removing the second shard
        original_unlink(self, missing_ok=missing_ok)
        if self.name.startswith("shard-"):
            removed.append(self.name)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setattr(Path, "unlink", unlink)
    other = PreprocessOptions(sizes=(8,), shard_bytes=SMALL_SHARDS.shard_bytes)
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, other, overwrite=True, show_progress=False)
    monkeypatch.undo()
    assert removed and not (out / "index.json").exists()  # never a manifest of deleted shards
    summary = preprocess(sample_imagefolder, out, other, overwrite=True, show_progress=False)
    assert summary.num_samples == 24 and verify_shards(out, show_progress=False) == []


def test_second_writer_is_refused(sample_imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    holder = os.open(out / ".fastdata-lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another run holds the folder
    try:
        with pytest.raises(PreprocessError, match="in use by another `fastdata preprocess` run"):
            preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
        assert not (out / ".fastdata-job").exists()
    finally:
        os.close(holder)
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert not (out / ".fastdata-lock").exists()


@pytest.mark.parametrize("target", ["index.json", "shard-00001.h5.json"])
def test_disk_full_gives_one_line_error_and_no_tmp(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    out = tmp_path / "o"
    original_dump = json.dump

    def dump(data: Any, fh: Any, **kwargs: Any) -> None:
        if f".{target}.tmp" in fh.name:
            fh.write("{")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original_dump(data, fh, **kwargs)

    monkeypatch.setattr(json, "dump", dump)
    with pytest.raises(PreprocessError, match=f"cannot write .*{target}: No space left on device$"):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    monkeypatch.undo()
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert not (out / "index.json").exists()
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert summary.num_samples == 24


def test_crash_after_manifest_leaves_no_job_folder_after_rerun(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    original_rmtree = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name == ".fastdata-job":
            raise KeyboardInterrupt  # killed between index.json and the cleanup
        original_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    monkeypatch.undo()
    assert (out / "index.json").exists() and (out / ".fastdata-job").exists()
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert (summary.num_reused_shards, summary.num_processed) == (8, 0)
    assert sorted(p.name for p in out.iterdir()) == ["index.json"] + [
        f"shard-{i:05d}.h5" for i in range(8)
    ]


def test_rerun_of_finished_set_on_read_only_folder_needs_no_lock(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    original_open = os.open

    def read_only_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return original_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only_open)
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, show_progress=False)
    assert (summary.num_reused_shards, summary.num_processed) == (8, 0)
    with pytest.raises(PreprocessError, match=r"cannot write to output folder .*Read-only"):
        preprocess(sample_imagefolder, tmp_path / "new", SMALL_SHARDS, show_progress=False)

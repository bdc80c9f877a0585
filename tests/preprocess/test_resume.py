"""Resumability after a crash or kill -9, and byte-for-byte determinism."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdata import PreprocessOptions, ShardReader, load_manifest
from fastdata.preprocess import ShardResult, _engine, preprocess
from fastdata.shards import verify_shards

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
    original_run = _engine.LocalEngine.run

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
    original_run = _engine.LocalEngine.run
    monkeypatch.setattr(_engine.LocalEngine, "run", _crash_after(2))
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=2, show_progress=False)
    assert not (out / "index.json").exists()
    first_two = _shard_bytes(out)
    assert sorted(first_two) == ["shard-00000.h5", "shard-00001.h5"]
    (out / ".shard-00002.h5.leftover").mkdir()  # a spill folder a killed writer left behind
    monkeypatch.setattr(_engine.LocalEngine, "run", original_run)
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
    original_run = _engine.LocalEngine.run
    monkeypatch.setattr(_engine.LocalEngine, "run", _crash_after(1))
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=1, show_progress=False)
    (out / "shard-00000.h5").write_bytes(b"damaged")
    monkeypatch.setattr(_engine.LocalEngine, "run", original_run)
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

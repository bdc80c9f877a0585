"""The output folder of a preprocessing job: its lock, its job records, and what a rerun
keeps.

``OUT/.fastdata-job/`` holds ``job.json`` (the options and a fingerprint of the input list)
and, per finished shard, ``shard-NNNNN.h5.json`` (its checksum, pixel statistics, skipped
inputs and a digest of its inputs' sizes and modification times), written right after the
shard is renamed into place. A rerun of the same job keeps every shard whose file matches
its record and whose inputs are unchanged, and redoes the rest; ``index.json`` is written
last, and the job folder is removed after it (or by the next run, after a crash in between).

One writer at a time: a run holds an exclusive ``flock`` on ``OUT/.fastdata-lock`` from
start to end (released by the kernel if the process dies); a second run is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fastdata._file_hash import shard_matches
from fastdata._files import write_json_atomic
from fastdata._progress import progress_bar
from fastdata.errors import PreprocessError
from fastdata.preprocess._sources import SourceItem
from fastdata.preprocess._task import ShardResult, ShardTask
from fastdata.shards import (
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    verify_shards,
)

JOB_DIR = ".fastdata-job"
LOCK_NAME = ".fastdata-lock"
_READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def inputs_digest(items: Sequence[SourceItem]) -> str:
    """SHA-256 over each input's size and modification time (and its mask's), in order: it
        changes when an input of the shard is replaced, repaired or edited (an object of a store:
    its listed size and version stamp). Names are covered by
        the job's fingerprint; paths are left out so that a moved source tree stays the same job.
    """
    digest = hashlib.sha256()
    for item in items:
        if item.version:  # an object of a store: its size and version stamp as listed
            digest.update(f"{item.version}\n".encode())
            continue
        for path in (item.path, item.mask):
            if path is None:
                continue
            try:
                status = os.stat(path)
                digest.update(f"{status.st_size}\0{status.st_mtime_ns}\n".encode())
            except OSError:
                digest.update(b"missing\n")
    return digest.hexdigest()


def write_or_fail(path: Path, data: Any) -> None:
    """``write_json_atomic`` with a one-line :class:`PreprocessError` (disk full...)."""
    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise PreprocessError(f"cannot write {path}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``root`` (created if missing) for one writer at a time.

    The lock is a ``flock`` on ``root/.fastdata-lock``, released by the kernel when this
    process ends however it ends. The file is removed on the way out; a waiter that locked
    a file removed meanwhile starts over on the new one.
    """
    if root.exists() and not root.is_dir():
        raise PreprocessError(f"output path exists and is not a folder: {root}")
    lock_path = root / LOCK_NAME
    try:
        root.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise PreprocessError(
                    f"output folder {root} is in use by another `fastdata preprocess` run "
                    f"(it holds {lock_path}); wait for it to finish or choose another folder"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
    except OSError as exc:
        if exc.errno in _READ_ONLY and (root / MANIFEST_NAME).is_file():
            # A finished set on a read-only folder: a rerun only checks it, and nobody
            # can write there meanwhile through this mount.
            yield
            return
        raise PreprocessError(f"cannot write to output folder {root}: {exc}") from exc
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock_path.unlink()
        os.close(fd)


def _is_ours(name: str) -> bool:
    return (
        name in (MANIFEST_NAME, JOB_DIR, LOCK_NAME)
        or (name.startswith("shard-") and name.endswith(".h5"))
        or name.startswith((".shard-", f".{MANIFEST_NAME}.tmp"))
    )


def _previous_record(root: Path) -> dict[str, Any] | None:
    if (root / MANIFEST_NAME).is_file():
        manifest = load_manifest(root)
        return {
            "options": manifest.options,
            "fingerprint": manifest.source.get("fingerprint"),
            "num_inputs": manifest.source.get("num_inputs"),
        }
    job_file = root / JOB_DIR / "job.json"
    if job_file.is_file():
        try:
            return dict(json.loads(job_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None
    return None


def _difference(previous: dict[str, Any] | None, record: dict[str, Any]) -> str | None:
    """What makes ``previous`` another job than ``record`` (``None``: the same job)."""
    if previous is None:
        return "the output of another job (unreadable job record)"
    old_options = previous.get("options")
    if not isinstance(old_options, dict):
        return "the output of another job (unreadable job record)"
    changed = [
        f"{key} {old_options.get(key)!r} -> {value!r}"
        for key, value in record["options"].items()
        if old_options.get(key) != value
    ]
    changed += [
        f"{key} {old_options[key]!r} -> unset"
        for key in old_options
        if key not in record["options"]
    ]
    if changed:
        return "the output of another job (options differ: " + "; ".join(changed) + ")"
    if previous.get("fingerprint") != record["fingerprint"]:
        return (
            f"the output of another job (the input list differs: {previous.get('num_inputs', '?')} "
            f"inputs then, {record['num_inputs']} now, or other names, labels or masks)"
        )
    return None


def _stale_shards(manifest: Manifest, tasks: list[ShardTask], job_id: str) -> str | None:
    """A description of the first shard whose inputs changed since it was written."""
    for info, task in zip(manifest.shards, tasks, strict=False):
        if info.inputs and info.inputs != task.inputs:
            first = task.items[0].name if task.items else "?"
            return (
                f"inputs of {info.file} (starting at {first!r}) changed size or modification "
                "time since it was written"
            )
    if len(manifest.shards) != len(tasks) or any(
        info.job and info.job != job_id for info in manifest.shards
    ):
        return "its shards were written by another version of this job"
    return None


def _remove_ours(root: Path) -> None:
    """Remove a previous job's files, ``index.json`` first: a crash midway leaves a folder
    without a manifest (an unfinished set), never a manifest naming deleted shards."""
    (root / MANIFEST_NAME).unlink(missing_ok=True)
    folder = os.open(root, os.O_RDONLY)  # make the removal durable before the shards go
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    for entry in root.iterdir():
        if _is_ours(entry.name) and entry.name != LOCK_NAME:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _remove_leftovers(root: Path) -> None:
    """Temporary files of a killed or failed run (spill folders, a half-written manifest)."""
    for entry in root.iterdir():
        if entry.name.startswith((".shard-", f".{MANIFEST_NAME}.tmp")):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def prepare_out(
    root: Path,
    record: dict[str, Any],
    tasks: list[ShardTask],
    job_id: str,
    overwrite: bool,
    *,
    show_progress: bool = False,
) -> Manifest | None:
    """Make ``root`` ready; return its manifest when it already holds this finished job
    (after re-hashing its shards, with a progress bar when ``show_progress``)."""
    names = [entry.name for entry in root.iterdir() if entry.name != LOCK_NAME]
    foreign = [name for name in names if not _is_ours(name)]
    holds_data = any(name == MANIFEST_NAME or name.startswith("shard-") for name in names)
    if (foreign or holds_data) and not overwrite:
        if foreign:
            raise PreprocessError(
                f"output folder {root} holds other files ({foreign[0]!r}...); pass --overwrite "
                "(overwrite=True) to replace them, or choose an empty folder"
            )
        difference = _difference(_previous_record(root), record)
        if difference is None and (root / MANIFEST_NAME).is_file():
            difference = _stale_shards(load_manifest(root), tasks, job_id)
        if difference is not None:
            raise PreprocessError(
                f"output folder {root} holds {difference}; pass --overwrite (overwrite=True) "
                "to replace it, or choose an empty folder"
            )
    try:
        if overwrite:
            _remove_ours(root)
        elif (root / MANIFEST_NAME).is_file():
            problems = verify_shards(root, show_progress=show_progress)
            if problems:
                raise PreprocessError(
                    f"finished output {root} fails verification ({problems[0].file}: "
                    f"{problems[0].reason}); rerun with --overwrite to rebuild it"
                )
            # A run killed between writing index.json and removing the job folder.
            shutil.rmtree(root / JOB_DIR, ignore_errors=True)
            _remove_leftovers(root)
            return load_manifest(root)
        (root / JOB_DIR).mkdir(exist_ok=True)
        _remove_leftovers(root)
        write_json_atomic(root / JOB_DIR / "job.json", {**record, "job": job_id})
    except OSError as exc:
        raise PreprocessError(f"cannot write to output folder {root}: {exc}") from exc
    return None


def finished_shards(
    root: Path, tasks: list[ShardTask], job_id: str, show_progress: bool = False
) -> dict[int, ShardResult]:
    """Shards of an interrupted run whose file still matches its record and whose inputs
    are unchanged (re-hashed, with a progress bar in bytes when ``show_progress``)."""
    candidates: list[tuple[ShardTask, ShardResult]] = []
    for task in tasks:
        record = root / JOB_DIR / f"{task.file}.json"
        if not record.is_file():
            continue
        try:
            result = ShardResult.from_json(json.loads(record.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (
            result.index == task.index
            and result.info.inputs == task.inputs
            and result.info.job == job_id
        ):
            candidates.append((task, result))
    done: dict[int, ShardResult] = {}
    if not candidates:
        return done
    total = sum(result.info.num_bytes for _, result in candidates)
    bar = progress_bar(total=total, desc="check finished shards", unit="B", enabled=show_progress)
    try:
        for task, result in candidates:
            before = bar.n
            if shard_matches(root / task.file, result.info, bar.update):
                done[task.index] = result
            bar.update(before + result.info.num_bytes - bar.n)  # unhashed or partly read
    finally:
        bar.close()
    return done

"""``preprocess()``: plan a job into shard tasks, run them on an engine, write the manifest.

Resumability: ``OUT/.fastdata-job/`` holds ``job.json`` (the options and a fingerprint of
the input list) and, per finished shard, ``shard-NNNNN.h5.json`` (its checksum, pixel
statistics, skipped inputs and a digest of its inputs' sizes and modification
times), written right after the shard is renamed into place. A rerun of the same job keeps
every shard whose file matches its record and whose inputs are unchanged, and redoes the
rest; ``index.json`` is written last, and the job folder is removed after it (or by the
next run, after a crash in between).

One writer at a time: a run holds an exclusive ``flock`` on ``OUT/.fastdata-lock`` from
start to end (released by the kernel if the process dies); a second run is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastdata._progress import progress_bar
from fastdata._system import usable_cpus
from fastdata.errors import PreprocessError
from fastdata.preprocess._engine import Engine, LocalEngine
from fastdata.preprocess._options import PreprocessOptions
from fastdata.preprocess._python_source import dataset_engine, list_dataset
from fastdata.preprocess._sources import SourceItem, SourceListing, list_source
from fastdata.preprocess._task import (
    SampleLoader,
    ShardJob,
    ShardResult,
    ShardTask,
    build_fields,
)
from fastdata.shards import (
    MANIFEST_NAME,
    FieldSpec,
    Manifest,
    load_manifest,
    shard_matches,
    verify_shards,
    write_json_atomic,
)

JOB_DIR = ".fastdata-job"
LOCK_NAME = ".fastdata-lock"
_READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_PATH_BYTES_ESTIMATE = 64


@dataclass(frozen=True)
class PreprocessSummary:
    """What a run did.

    Attributes:
        out: The shard folder.
        num_samples: Samples stored in the whole shard set.
        num_skipped: Inputs left out (unreadable), over the whole shard set.
        num_shards: Shard files in the set.
        num_reused_shards: Shards kept from an earlier, interrupted or complete, run.
        num_processed: Inputs processed by this run (not counting reused shards).
        num_bytes: Bytes of all shard files.
        elapsed_s: Wall-clock seconds of this run.
    """

    out: Path
    num_samples: int
    num_skipped: int
    num_shards: int
    num_reused_shards: int
    num_processed: int
    num_bytes: int
    elapsed_s: float

    @property
    def images_per_s(self) -> float:
        """Inputs processed by this run per second."""
        return self.num_processed / self.elapsed_s if self.elapsed_s > 0 else 0.0


def plan_tasks(
    listing: SourceListing, fields: tuple[FieldSpec, ...], options: PreprocessOptions
) -> list[ShardTask]:
    """Split the items into consecutive shards of about ``options.shard_bytes``."""
    per_sample = _PATH_BYTES_ESTIMATE
    for spec in fields:
        if spec.kind == "array":
            per_sample += spec.sample_nbytes
        elif spec.encoding in ("jpeg", "png"):  # ~2.7 bits per pixel and channel at q90
            per_sample += max(options.sizes) ** 2 * (1 if options.grayscale else 3) // 3
    per_shard = max(1, options.shard_bytes // per_sample)
    items = listing.items
    return [
        ShardTask(i, tuple(items[i * per_shard : (i + 1) * per_shard]))
        for i in range(math.ceil(len(items) / per_shard))
    ]


def preprocess(
    src: str | Path | Any,
    out: str | Path,
    options: PreprocessOptions | None = None,
    *,
    kind: str = "auto",
    masks: str | Path | None = None,
    mask_suffix: str | None = None,
    path_column: str | None = None,
    label_column: str | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    engine: Engine | None = None,
) -> PreprocessSummary:
    """Turn a source into uint8 HDF5 shards plus ``index.json`` (see docs/FORMAT.md).

    Args:
        src: Image folder, CSV/TSV list, segmentation image folder or ``.npy`` folder;
            or a map-style dataset object (``len`` and ``[i]``; items ``(image, label)``,
            ``(image, label, mask)`` or dicts; images PIL, uint8 HWC ndarrays or uint8
            CHW tensors: see the README and ``fastdata.preprocess._python_source``).
        out: Output folder; created if missing.
        options: What to store (sizes, resize mode, storage, ...); defaults to
            ``PreprocessOptions()``: raw 224x224 RGB.
        kind: Source kind of a path (see :func:`list_source`), ``"auto"`` by default.
        masks: Mask folder of a segmentation source (a path).
        mask_suffix: Masks are named ``<image stem><mask_suffix>.<ext>`` (in ``masks``,
            or beside the images when ``masks`` is not given).
        path_column: Column of the paths in a CSV/TSV list (header name or 0-based
            number); see :func:`list_source`.
        label_column: Column of the labels in a CSV/TSV list, as ``path_column``.
        workers: Local processes; default: the CPUs this process may use (cgroup-aware).
        overwrite: Replace an ``out`` that holds a different job or other files.
        show_progress: Show a progress bar.
        engine: Runs the shard tasks; default a :class:`LocalEngine` of ``workers``.

    Returns:
        A :class:`PreprocessSummary`.

    Raises:
        ValueError, TypeError: Bad arguments, or a dataset item of an unsupported form
            (the message names its index and what it holds).
        PreprocessError: Missing/empty/inconsistent source, ``out`` not writable or
            holding another job, a write failing (disk full), or an unreadable input with
            ``on_error="fail"``. Shards finished before the error stay for a resume; no
            partial file is left and ``index.json`` is not written.
    """
    started = time.perf_counter()
    options = PreprocessOptions() if options is None else options
    if not isinstance(options, PreprocessOptions):
        raise TypeError(f"options must be a PreprocessOptions, got {type(options).__name__}")
    if engine is None:
        engine = LocalEngine(usable_cpus() if workers is None else workers)
    root = Path(out).absolute()
    loader = None
    if isinstance(src, (str, os.PathLike)):
        listing = list_source(
            Path(src),
            kind=kind,
            masks=masks,
            mask_suffix=mask_suffix,
            path_column=path_column,
            label_column=label_column,
            on_error=options.on_error,
            exclude=(root,),
        )
    else:
        path_only = {
            "kind": None if kind == "auto" else kind,
            "masks": masks,
            "mask_suffix": mask_suffix,
            "path_column": path_column,
            "label_column": label_column,
        }
        given = {name: value for name, value in path_only.items() if value is not None}
        if given:
            raise ValueError(
                "kind and masks (and mask_suffix, path_column, label_column) describe a path "
                f"source; a dataset object's items carry their own labels and masks (got {given})"
            )
        listing = list_dataset(src)
        loader = listing.loader
        engine = dataset_engine(loader, engine)
    fields = build_fields(listing, options)
    tasks = plan_tasks(listing, fields, options)
    if loader is None:  # files: a shard is stale when one of its inputs changed
        tasks = [replace(t, inputs=_inputs_digest(t.items)) for t in tasks]
    record: dict[str, Any] = {"options": options.to_json(), "fingerprint": listing.fingerprint()}
    job_id = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    with _exclusive(root):
        return _run_job(
            root,
            listing=listing,
            fields=fields,
            tasks=tasks,
            options=options,
            record=record,
            job_id=job_id,
            overwrite=overwrite,
            engine=engine,
            show_progress=show_progress,
            started=started,
            loader=loader,
        )


def _run_job(
    root: Path,
    *,
    listing: SourceListing,
    fields: tuple[FieldSpec, ...],
    tasks: list[ShardTask],
    options: PreprocessOptions,
    record: dict[str, Any],
    job_id: str,
    overwrite: bool,
    engine: Engine,
    show_progress: bool,
    started: float,
    loader: SampleLoader | None,
) -> PreprocessSummary:
    """The job, run while holding the output folder's lock."""
    complete = _prepare_out(
        root,
        {**record, "num_inputs": len(listing.items)},
        tasks,
        job_id,
        overwrite,
        show_progress=show_progress,
    )
    if complete is not None:
        return _summary(root, complete, len(complete.shards), 0, started)
    done = _finished_shards(root, tasks, job_id, show_progress)
    pending = [task for task in tasks if task.index not in done]
    job = ShardJob(str(root), options, fields, listing.kind, job_id, loader=loader)
    bar = progress_bar(
        total=sum(len(t.items) for t in pending),
        desc="preprocess",
        unit="img",
        enabled=show_progress,
    )
    phase = _Phase(bar, pending)
    try:
        for result in engine.run(pending, job, phase.advance):
            _write_or_fail(root / JOB_DIR / f"{result.info.file}.json", result.to_json())
            done[result.index] = result
            phase.landed(result.info.file)
    finally:
        bar.close()
    manifest = Manifest(
        fields=list(fields),
        shards=[done[t.index].info for t in tasks],
        class_names=listing.class_names,
        stats=_combine_stats([done[t.index] for t in tasks]),
        source={**listing.describe(), "fingerprint": record["fingerprint"]},
        options=record["options"],
        skipped=listing.skipped + [s for t in tasks for s in done[t.index].skipped],
    )
    _write_or_fail(root / MANIFEST_NAME, manifest.to_json())
    shutil.rmtree(root / JOB_DIR, ignore_errors=True)
    reused = len(tasks) - len(pending)
    return _summary(root, manifest, reused, sum(len(t.items) for t in pending), started)


class _Phase:
    """Keeps the progress bar's postfix on what the job is doing: a shard whose samples have
    all arrived is being finalised (copy, fsync, SHA-256: seconds for a large shard), which
    the bar shows at once instead of sitting at the last count it drew."""

    def __init__(self, bar: Any, tasks: list[ShardTask]) -> None:
        self._bar = bar
        self._ends = list(itertools.accumulate(len(task.items) for task in tasks))
        self._files = [task.file for task in tasks]
        self._count = 0
        self._next = 0
        self._finalising: set[str] = set()

    def advance(self, count: int) -> None:
        self._bar.update(count)
        self._count += count
        changed = False
        while self._next < len(self._ends) and self._count >= self._ends[self._next]:
            self._finalising.add(self._files[self._next])
            self._next += 1
            changed = True
        if changed:
            self._show()

    def landed(self, file: str) -> None:
        self._finalising.discard(file)
        self._show()

    def _show(self) -> None:
        if not self._finalising:
            text = ""
        elif len(self._finalising) == 1:
            text = f"finalising {next(iter(self._finalising))} (fsync, SHA-256)"
        else:
            text = f"finalising {len(self._finalising)} shards (fsync, SHA-256)"
        self._bar.set_postfix_str(text, refresh=True)


def _inputs_digest(items: tuple[SourceItem, ...]) -> str:
    """SHA-256 over each input's size and modification time (and its mask's), in order: it
    changes when an input of the shard is replaced, repaired or edited. Names are covered by
    the job's fingerprint; paths are left out so that a moved source tree stays the same job.
    """
    digest = hashlib.sha256()
    for item in items:
        for path in (item.path, item.mask):
            if path is None:
                continue
            try:
                status = os.stat(path)
                digest.update(f"{status.st_size}\0{status.st_mtime_ns}\n".encode())
            except OSError:
                digest.update(b"missing\n")
    return digest.hexdigest()


def _write_or_fail(path: Path, data: Any) -> None:
    """``write_json_atomic`` with a one-line :class:`PreprocessError` (disk full...)."""
    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise PreprocessError(f"cannot write {path}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
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


def _summary(
    root: Path, manifest: Manifest, reused: int, processed: int, started: float
) -> PreprocessSummary:
    return PreprocessSummary(
        out=root,
        num_samples=manifest.num_samples,
        num_skipped=len(manifest.skipped),
        num_shards=len(manifest.shards),
        num_reused_shards=reused,
        num_processed=processed,
        num_bytes=manifest.num_bytes,
        elapsed_s=time.perf_counter() - started,
    )


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


def _prepare_out(
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


def _finished_shards(
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


def _combine_stats(results: list[ShardResult]) -> dict[str, dict[str, Any]]:
    """Per-channel mean/std (0-255 scale) of each image field over all shards, in order."""
    totals: dict[str, list[Any]] = {}
    for result in results:
        for name, part in result.stats.items():
            total = totals.setdefault(
                name, [0, 0.0, [0.0] * len(part["sum"]), [0.0] * len(part["sum"])]
            )
            total[0] += part["count"]
            total[1] += part["pixels"]
            total[2] = [a + b for a, b in zip(total[2], part["sum"], strict=True)]
            total[3] = [a + b for a, b in zip(total[3], part["sumsq"], strict=True)]
    stats: dict[str, dict[str, Any]] = {}
    for name, (count, pixels, sums, squares) in totals.items():
        mean = [s / pixels for s in sums]
        std = [math.sqrt(max(0.0, q / pixels - m * m)) for q, m in zip(squares, mean, strict=True)]
        stats[name] = {"mean": mean, "std": std, "count": count}
    return stats

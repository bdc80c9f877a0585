"""``preprocess()``: plan a job into shard tasks, run them on an engine, write the manifest.

The output folder's lock, job records and resume rules live in :mod:`._outdir`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastdata._progress import progress_bar
from fastdata._storage import RemoteOutput, is_url, parse_location
from fastdata._system import usable_cpus
from fastdata.errors import PreprocessError
from fastdata.preprocess._detection import add_source_record, source_skipped
from fastdata.preprocess._options import PreprocessOptions
from fastdata.preprocess._outdir import (
    JOB_DIR,
    exclusive,
    finished_shards,
    inputs_digest,
    prepare_out,
    write_or_fail,
)
from fastdata.preprocess._python_source import dataset_engine, list_dataset
from fastdata.preprocess._source_records import Source, list_path
from fastdata.preprocess._sources import SourceListing
from fastdata.preprocess._stats import PixelStats, merge_fields
from fastdata.preprocess._task import (
    SampleLoader,
    ShardJob,
    ShardResult,
    ShardTask,
    build_fields,
)
from fastdata.preprocess.engine import Engine, LocalEngine
from fastdata.shards import (
    MANIFEST_NAME,
    FieldSpec,
    Manifest,
    load_manifest,
)

_PATH_BYTES_ESTIMATE = 64
# Shards one job writes at most: a million 64 MiB shards is 64 TiB (index.json lists them
# all); a dataset object claiming more items than that holds is refused in one line.
MAX_SHARDS = 1_000_000


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
    """Split the items into consecutive shards of about ``options.shard_bytes``.

    Raises:
        PreprocessError: More than :data:`MAX_SHARDS` shards.
    """
    per_sample = _PATH_BYTES_ESTIMATE
    for spec in fields:
        if spec.field_kind.fixed_size:
            per_sample += spec.sample_nbytes
        elif spec.encoding in ("jpeg", "png"):  # ~2.7 bits per pixel and channel at q90
            per_sample += max(options.sizes) ** 2 * (1 if options.grayscale else 3) // 3
        elif spec.field_kind.variable_images:  # shorter side S, a 4:3 photo's pixels
            channels = math.prod(spec.shape)
            per_sample += max(options.sizes) ** 2 * channels * 4 // 3
    per_shard = max(1, options.shard_bytes // per_sample)
    items = listing.items
    num_shards = math.ceil(len(items) / per_shard)
    if num_shards > MAX_SHARDS:
        raise PreprocessError(
            f"{len(items):,} inputs of about {per_sample:,} bytes each make {num_shards:,} "
            f"shards of shard_bytes={options.shard_bytes:,}, more than the {MAX_SHARDS:,} one "
            "job writes: raise shard_bytes (--shard-mb), or split the source"
        )
    tasks = []
    for i in range(num_shards):
        part = items[i * per_shard : (i + 1) * per_shard]  # a dataset's: a range, not a list
        tasks.append(ShardTask(i, tuple(part) if isinstance(part, list) else part))
    return tasks


def preprocess(
    src: str | os.PathLike[str] | Source | Any,
    out: str | Path,
    options: PreprocessOptions | None = None,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    engine: Engine | None = None,
) -> PreprocessSummary:
    """Turn a source into uint8 HDF5 shards plus ``index.json`` (see docs/FORMAT.md).

    Args:
        src: What to read. A path: a CSV/TSV list file, a folder of ``.npy`` arrays, or
            an ImageFolder (``src/<class>/<image>``). A source record for the rest, or to
            set a kind's options: :class:`ImageFolderSource`, :class:`FileListSource`
            (columns), :class:`SegmentationSource` (images + masks),
            :class:`NpyFolderSource`. Or a map-style dataset object (``len`` and ``[i]``;
            items ``(image, label)``, ``(image, label, mask)`` or dicts; images PIL, uint8
            HWC ndarrays or uint8 CHW tensors: see the preprocessing guide).
        out: Output folder; created if missing.
        options: What to store (sizes, resize mode, storage, ...); defaults to
            ``PreprocessOptions()``: raw 224x224 RGB.
        workers: Local processes; default: the CPUs this process may use (cgroup-aware).
        overwrite: Replace an ``out`` that holds a different job or other files.
        show_progress: Show a progress bar.
        engine: Runs the shard tasks; default a
            :class:`~fastdata.preprocess.engine.LocalEngine` of ``workers``.

    Returns:
        A :class:`PreprocessSummary`.

    Raises:
        ValueError, TypeError: Bad arguments, or a dataset item of an unsupported form
            (the message names its index and what it holds).
        PreprocessError: Missing/empty/inconsistent source, ``out`` not writable or
            holding another job, a write failing (disk full), an unreadable input with
            ``on_error="raise"``, or every input unreadable (nothing to store). Shards
            finished before the error stay for a resume; no partial file is left and
            ``index.json`` is not written.
    """
    started = time.perf_counter()
    options = PreprocessOptions() if options is None else options
    if not isinstance(options, PreprocessOptions):
        raise TypeError(f"options must be a PreprocessOptions, got {type(options).__name__}")
    if engine is None:
        engine = LocalEngine(usable_cpus() if workers is None else workers)
    path = src.path if isinstance(src, Source) else src
    # a URL of an unsupported scheme is refused here, in one line
    if isinstance(path, (str, os.PathLike)):
        parse_location(path, "src")
    out_location = parse_location(out, "out")
    # object storage: the job runs in a local staging folder and uploads as shards land
    remote = None
    if isinstance(out_location, Path):
        root = out_location.absolute()
    else:
        remote = RemoteOutput(out_location)
        root = remote.staging
        root.mkdir(parents=True, exist_ok=True)
    loader = None
    if isinstance(src, Source):
        listing = src.listing(on_error=options.on_error, exclude=(root,))
    elif isinstance(src, (str, os.PathLike)):
        listing = list_path(
            str(src) if is_url(src) else Path(src), on_error=options.on_error, exclude=(root,)
        )
    else:
        skipped = source_skipped(src, options.on_error)  # bad annotations of a source
        listing = list_dataset(src, max_pixels=options.max_pixels)
        add_source_record(listing, src, skipped)
        loader = listing.loader
        engine = dataset_engine(loader, engine)
    fields = build_fields(listing, options)
    tasks = plan_tasks(listing, fields, options)
    if loader is None:  # files: a shard is stale when one of its inputs changed
        tasks = [replace(t, inputs=inputs_digest(t.items)) for t in tasks]
    record: dict[str, Any] = {"options": options.to_json(), "fingerprint": listing.fingerprint()}
    job_id = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    with exclusive(root):
        summary = _run_job(
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
            landed=None if remote is None else remote.shard_done,
        )
        if remote is not None:  # what an earlier run left unsent, then the manifest
            shards = load_manifest(root).shards
            remote.finish([(info.file, info.num_bytes, info.sha256) for info in shards])
        return summary


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
    landed: Callable[[Path, int, str], None] | None = None,
) -> PreprocessSummary:
    """The job, run while holding the output folder's lock; ``landed(path, num_bytes,
    sha256)`` is called with each shard once it is complete."""
    complete = prepare_out(
        root,
        {**record, "num_inputs": len(listing.items)},
        tasks,
        job_id,
        overwrite,
        show_progress=show_progress,
    )
    if complete is not None:
        return _summary(root, complete, len(complete.shards), 0, started)
    done = finished_shards(root, tasks, job_id, show_progress)
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
            write_or_fail(root / JOB_DIR / f"{result.info.file}.json", result.to_json())
            done[result.index] = result
            phase.landed(result.info.file)
            if landed is not None:
                landed(root / result.info.file, result.info.num_bytes, result.info.sha256)
    finally:
        bar.close()
    _check_something_stored(tasks, done)
    manifest = Manifest(
        fields=list(fields),
        shards=[done[t.index].info for t in tasks],
        class_names=listing.class_names,
        stats=_combine_stats([done[t.index] for t in tasks]),
        source={**listing.describe(), "fingerprint": record["fingerprint"]},
        options=record["options"],
        skipped=listing.skipped + [s for t in tasks for s in done[t.index].skipped],
    )
    write_or_fail(root / MANIFEST_NAME, manifest.to_json())
    shutil.rmtree(root / JOB_DIR, ignore_errors=True)
    reused = len(tasks) - len(pending)
    return _summary(root, manifest, reused, sum(len(t.items) for t in pending), started)


def _check_something_stored(tasks: list[ShardTask], done: dict[int, ShardResult]) -> None:
    """Refuse to call a job done when every input failed: its set would hold nothing.

    Raises:
        PreprocessError: Naming the count and the first input's reason; ``index.json`` is
            not written, so the folder is no shard set (a rerun after fixing the inputs
            redoes the shards whose inputs changed).
    """
    if not tasks or any(done[task.index].info.num_samples for task in tasks):
        return
    failures = [entry for task in tasks for entry in done[task.index].skipped]
    first = f": {failures[0]['path']}: {failures[0]['reason']}" if failures else ""
    raise PreprocessError(
        f"every input failed ({len(failures)} of {len(failures)}), so nothing was stored and "
        f"index.json was not written; the first{first}"
    )


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


def _combine_stats(results: list[ShardResult]) -> dict[str, dict[str, Any]]:
    """Per-channel mean/std (0-255 scale) of each image field over all shards, in order."""
    totals: dict[str, PixelStats] = {}
    for result in results:
        totals = merge_fields(totals, result.stats)
    return {name: stats.summary() for name, stats in totals.items()}

"""Building RAM stores: from image files, from shard sets, from arrays.

Each loader estimates the bytes it will allocate and checks them against the available
memory before allocating anything, then fills one shared buffer per field.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastdata._progress import progress_bar
from fastdata.datasets._memory import check_memory
from fastdata.datasets._shm import SharedBuffer
from fastdata.datasets._store import RAMStore
from fastdata.shards import FieldSpec, Manifest, ShardReader

_JPEG_SUFFIXES = (b".jpg", b".jpeg")


def packed(items: Sequence[bytes], name: str) -> tuple[SharedBuffer, SharedBuffer]:
    """Pack byte strings into one ``(blob, int64 offsets)`` pair of shared buffers."""
    lengths = np.array([len(v) for v in items], np.int64)
    offsets = SharedBuffer(8 * (len(items) + 1), f"{name}-offsets")
    offsets_view = offsets.array.view(np.int64)
    np.cumsum(lengths, out=offsets_view[1:])
    blob = SharedBuffer(int(offsets_view[-1]), name)
    if items:
        blob.array[:] = np.frombuffer(b"".join(items), np.uint8)
    return blob, offsets


def int64_buffer(values: np.ndarray, name: str) -> SharedBuffer:
    """``values`` as an ``int64`` shared buffer."""
    buffer = SharedBuffer(8 * len(values), name)
    buffer.array.view(np.int64)[:] = values
    return buffer


def load_files(
    paths: Sequence[str | os.PathLike[str]],
    targets: np.ndarray | None,
    *,
    override_memory_check: bool,
    show_progress: bool,
) -> RAMStore:
    """Read every file's bytes into one blob (``image``), with ``label`` from ``targets``."""
    # One list of encoded names (no list of str beside it): after loading, Python keeps
    # part of the memory of such per-sample lists even once they are freed.
    names = [os.fspath(p).encode() for p in paths]
    sizes = np.empty(len(names), np.int64)
    for k, name in enumerate(names):
        try:
            sizes[k] = os.stat(name).st_size
        except OSError as exc:
            raise FileNotFoundError(
                f"image_paths[{k}] cannot be read: {name.decode()} ({exc})"
            ) from exc
    needed = int(sizes.sum()) + 8 * (2 * len(names) + 2) + sum(map(len, names))
    needed += 0 if targets is None else 8 * len(names)
    check_memory(needed, what=f"{len(names)} image files", override=override_memory_check)
    offsets = SharedBuffer(8 * (len(names) + 1), "image-offsets")
    offsets_view = offsets.array.view(np.int64)
    np.cumsum(sizes, out=offsets_view[1:])
    blob = SharedBuffer(int(offsets_view[-1]), "image")
    bar = progress_bar(total=int(sizes.sum()), desc="load images", unit="B", enabled=show_progress)
    try:
        for k, name in enumerate(names):
            start, stop = int(offsets_view[k]), int(offsets_view[k + 1])
            with open(name, "rb") as fh:
                read = fh.readinto(blob.array[start:stop].data)  # no bytes objects
            if read != stop - start:
                raise OSError(f"image_paths[{k}] changed size while loading: {name.decode()}")
            bar.update(stop - start)
    finally:
        bar.close()
    encoding = "jpeg" if all(n.lower().endswith(_JPEG_SUFFIXES) for n in names) else "image"
    specs = [FieldSpec("image", "encoded", "uint8", encoding=encoding)]
    buffers = {"image": blob}
    if targets is not None:
        specs.append(FieldSpec("label", "array", "int64"))
        buffers["label"] = int64_buffer(targets, "label")
    return RAMStore(specs, buffers, {"image": offsets}, len(names), packed(names, "paths"))


def load_shards(
    path: str | Path,
    fields: Sequence[str],
    *,
    override_memory_check: bool,
    show_progress: bool,
    **cache: Any,
) -> tuple[RAMStore, Manifest]:
    """Copy ``fields`` of every shard of a shard set into shared buffers (a remote set
    through the cache: ``cache_dir``, ``cache_limit``); the store and the set's manifest."""
    reader = ShardReader(path, **cache)
    try:
        specs = [reader.field(name) for name in fields]
        n = len(reader)
        shards = range(len(reader.manifest.shards))
        counts = [info.num_samples for info in reader.manifest.shards]

        def packed(shard: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
            return {
                spec.name: spec.field_kind.pack(reader.view(spec.name, shard)) for spec in specs
            }

        # Sizes first, then the copy, one shard at a time: a remote set's shards need not
        # fit in its cache together. Fixed-size fields are sized from the manifest; only
        # fields whose samples vary in size (encoded bytes) need the shards opened for it,
        # so a remote set larger than its cache is downloaded once without them, twice
        # with them.
        sizes = {spec.name: n * _sample_bytes(spec) for spec in specs if spec.field_kind.fixed_size}
        varying = [spec for spec in specs if spec.name not in sizes]
        sizes.update((spec.name, 0) for spec in varying)
        for s in shards if varying else ():
            for spec in varying:
                payload, _ = spec.field_kind.pack(reader.view(spec.name, s))
                sizes[spec.name] += int(payload.nbytes)
            if reader.files.remote:
                reader.close()
        packs = (packed(s) for s in shards)
        # fields whose samples vary in size keep their offsets
        columns = {
            spec.name: spec.field_kind.offset_columns
            for spec in specs
            if not spec.field_kind.fixed_size
        }
        needed = sum(sizes.values()) + 8 * (n + 1) * sum(columns.values())
        check_memory(needed, what=f"shard set {path}", override=override_memory_check)
        buffers = {name: SharedBuffer(nbytes, name) for name, nbytes in sizes.items()}
        offsets = {
            name: SharedBuffer(8 * (n + 1) * width, f"{name}-offsets")
            for name, width in columns.items()
        }
        bar = progress_bar(total=needed, desc="load shards", unit="B", enabled=show_progress)
        sample_start = 0
        byte_start = dict.fromkeys(sizes, 0)
        row_start = dict.fromkeys(sizes, 0)  # offsets count the payload's rows
        for shard_packs, count in zip(packs, counts, strict=True):
            for name, (payload, local) in shard_packs.items():
                start, length = byte_start[name], int(payload.nbytes)
                if length:
                    target = buffers[name].array[start : start + length]
                    target.view(payload.dtype).reshape(payload.shape)[...] = payload[...]
                byte_start[name] += length
                if local is not None:  # offsets first, per-sample values beside them
                    view = offsets[name].array.view(np.int64).reshape(n + 1, -1)
                    rows = view[sample_start : sample_start + count + 1]
                    rows[...] = local.reshape(count + 1, -1)
                    rows[:, 0] += row_start[name]
                    length += 8 * count * columns[name]
                row_start[name] += len(payload)
                bar.update(length)
            sample_start += count
        bar.close()
    finally:
        reader.close()
    return RAMStore(specs, buffers, offsets, n), reader.manifest


def _sample_bytes(spec: FieldSpec) -> int:
    """Bytes of one sample of a fixed-size field (its shape and dtype)."""
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def load_arrays(
    arrays: dict[str, np.ndarray], axes: dict[str, str], *, override_memory_check: bool
) -> RAMStore:
    """Copy same-length arrays (``(N, ...)`` each) into shared buffers, one per field."""
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays must all have the same length, got {lengths}")
    n = next(iter(lengths.values()))
    check_memory(
        sum(a.nbytes for a in arrays.values()), what="arrays", override=override_memory_check
    )
    specs, buffers = [], {}
    for name, array in arrays.items():
        spec = FieldSpec(name, "array", array.dtype.name, tuple(array.shape[1:]), axes[name])
        buffer = SharedBuffer(array.nbytes, name)
        buffer.array.view(array.dtype).reshape(array.shape)[:] = array
        specs.append(spec)
        buffers[name] = buffer
    return RAMStore(specs, buffers, {}, n)

"""Tiny shard sets and image folders built in ``tmp_path`` for the dataset tests."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch.distributed as dist

from fastdata import RAMDataset
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from tests.decode.conftest import rgb_jpeg

NUM_SAMPLES = 22
SIZE = (12, 10)  # (H, W)
SHARD_SIZES = (9, 9, 4)


@dataclass
class Reference:
    """What the fixtures wrote: the NumPy reference every test compares against."""

    path: Path
    images: np.ndarray  # (N, H, W, 3) uint8
    labels: np.ndarray  # (N,) int64
    masks: np.ndarray  # (N, H, W) uint8
    jpegs: list[bytes]


def _reference(tmp_path: Path) -> Reference:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (NUM_SAMPLES, *SIZE, 3), dtype=np.uint8)
    labels = rng.integers(0, 5, NUM_SAMPLES).astype(np.int64)
    masks = rng.integers(0, 3, (NUM_SAMPLES, *SIZE), dtype=np.uint8)
    jpegs = [bytes(cv2.imencode(".png", im[:, :, ::-1])[1]) for im in images]  # lossless
    return Reference(tmp_path, images, labels, masks, jpegs)


def write_shards(
    root: Path,
    fields: list[FieldSpec],
    samples: list[dict],
    shard_sizes: Sequence[int] = SHARD_SIZES,
) -> Path:
    """Write ``samples`` into shards of ``shard_sizes`` plus the manifest."""
    root.mkdir(parents=True, exist_ok=True)
    infos, start = [], 0
    for number, count in enumerate(shard_sizes):
        with ShardWriter(root / f"shard-{number:05d}.h5", fields) as writer:
            for sample in samples[start : start + count]:
                writer.append(sample)
            infos.append(writer.close())
        start += count
    save_manifest(root, Manifest(fields=fields, shards=infos, class_names=list("abcde")))
    return root


@contextmanager
def gloo_group(rank: int, store: str, world_size: int = 2) -> Iterator[None]:
    """Join a gloo process group on loopback as ``rank`` (in a process ``mp.spawn``
    started; ``store`` is the rendezvous file), and leave it at the end."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def raw_shards(tmp_path: Path) -> Reference:
    """Raw HWC uint8 images, int64 labels and HW masks in three shards."""
    ref = _reference(tmp_path)
    fields = [
        FieldSpec("image", "array", "uint8", (*SIZE, 3), "HWC"),
        FieldSpec("label", "array", "int64"),
        FieldSpec("mask", "array", "uint8", SIZE, "HW"),
    ]
    samples = [
        {"image": ref.images[i], "label": int(ref.labels[i]), "mask": ref.masks[i]}
        for i in range(NUM_SAMPLES)
    ]
    ref.path = write_shards(tmp_path / "raw", fields, samples)
    return ref


@pytest.fixture
def encoded_shards(tmp_path: Path) -> Reference:
    """Losslessly encoded images (PNG bytes in a field of encoding ``jpeg`` would lie, so
    the field says ``png``; JPEG-mode code paths are the same) and int64 labels."""
    ref = _reference(tmp_path)
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="png"),
        FieldSpec("label", "array", "int64"),
    ]
    samples = [{"image": ref.jpegs[i], "label": int(ref.labels[i])} for i in range(NUM_SAMPLES)]
    ref.path = write_shards(tmp_path / "encoded", fields, samples)
    return ref


@pytest.fixture
def image_files(tmp_path: Path) -> tuple[list[Path], Reference]:
    """The reference images as PNG files."""
    ref = _reference(tmp_path)
    folder = tmp_path / "files"
    folder.mkdir()
    paths = []
    for i, data in enumerate(ref.jpegs):
        paths.append(folder / f"{i:03d}.png")
        paths[-1].write_bytes(data)
    return paths, ref


def write_jpegs(folder: Path, count: int, height: int, width: int) -> list[Path]:
    """``count`` smooth JPEG files of three heights (from ``height``) and two widths (from
    ``width``), as photos vary."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"{i:03d}.jpg"
        path.write_bytes(
            rgb_jpeg(height + height // 12 * (i % 3), width - width // 16 * (i % 2), i)
        )
        paths.append(path)
    return paths


def decoded_two_ways(
    paths: list[Path], transform: Callable[[], Any], planned: str, **kwargs: Any
) -> tuple[RAMDataset, RAMDataset]:
    """A RAMDataset over ``paths`` whose plan runs the transform's lead in the decode
    (``planned``: the plan field, ``"decode_crop"`` or ``"decode_center"``), and the same
    dataset running the whole transform after a full decode (each with its own
    ``transform()``, of the same seeds)."""
    labels = list(range(len(paths)))
    in_decode = RAMDataset(paths, labels, transform(), show_progress=False, **kwargs)
    assert getattr(in_decode.plan, planned) is not None
    after = RAMDataset(paths, labels, transform(), show_progress=False, **kwargs)
    after.plan = dataclasses.replace(after.plan, **{planned: None, "after_decode": None})
    return in_decode, after

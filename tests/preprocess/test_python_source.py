"""Dataset objects as a preprocessing source: forms, errors, workers, determinism, resume, CLI.

The datasets live at module level so that spawned worker processes can unpickle them.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from fastdata import PreprocessOptions, load_manifest
from fastdata.cli import main
from fastdata.errors import PreprocessError
from fastdata.preprocess import ImageFolderSource, preprocess
from fastdata.preprocess import engine as engine_module
from fastdata.preprocess._dataset_items import DatasetTypeError, DatasetValueError
from fastdata.preprocess._python_source import DatasetItem, list_dataset
from fastdata.preprocess._runner import plan_tasks
from fastdata.preprocess._task import build_fields
from fastdata.preprocess.engine import LocalEngine, ShardJob, ShardResult, ShardTask
from fastdata.shards import ShardReader
from tests.preprocess.conftest import shard_bytes

N = 12
SIDE = 16
# 4 samples per shard (16x16x3 pixels, a label, ~64 bytes of path): 3 shards of 12.
OPTIONS = PreprocessOptions(sizes=(SIDE,), shard_bytes=4 * (SIDE * SIDE * 3 + 8 + 64))
CLASSES = ["cat", "dog", "eel"]


def pixels(index: int) -> np.ndarray:
    """``(H, W, 3)`` uint8 noise; sizes vary with the index, portrait and landscape, with a
    shorter side of 32 and even sides: halving them to 16 is exactly a 2x2 area average,
    which every antialiased downscale agrees on (the reference below is exact)."""
    height, width = (32 + 2 * (index % 5), 32) if index % 2 else (32, 34 + 2 * (index % 4))
    return np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)


def mask_of(index: int) -> np.ndarray:
    return (pixels(index)[..., 0] // 64).astype(np.uint8)  # class ids 0..3


def reference(image: np.ndarray, side: int, nearest: bool = False) -> np.ndarray:
    """Independent reference of ``shorter``: the centred square, resized to ``side``
    (INTER_AREA down, INTER_NEAREST for masks)."""
    h, w = image.shape[:2]
    square = min(h, w)
    top, left = (h - square) // 2, (w - square) // 2
    flag = cv2.INTER_NEAREST if nearest else cv2.INTER_AREA
    crop = image[top : top + square, left : left + square]
    return cv2.resize(crop, (side, side), interpolation=flag)


class PILDataset:
    """torchvision-like: ``classes``, items ``(PIL image, int)``."""

    classes = CLASSES

    def __init__(self, size: int = N) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return Image.fromarray(pixels(index)), index % 3


class ArrayDataset(PILDataset):
    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:  # type: ignore[override]
        return pixels(index), np.int64(index % 3)


class TensorDataset(PILDataset):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return torch.from_numpy(pixels(index)).permute(2, 0, 1), torch.tensor(index % 3)


class DictMaskDataset(PILDataset):
    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        return {"image": pixels(index), "label": index % 3, "mask": mask_of(index), "id": "x"}


class LockedDataset(ArrayDataset):
    """Holds a lock, as datasets holding open files or clients do: it cannot be pickled."""

    def __init__(self, size: int = N) -> None:
        super().__init__(size)
        self.lock = threading.Lock()


class PatchedDataset(ArrayDataset):
    """``ArrayDataset`` with some items replaced (bad items, changed data)."""

    def __init__(self, items: dict[int, Any], size: int = N) -> None:
        super().__init__(size)
        self.items = items

    def __getitem__(self, index: int) -> Any:
        item = self.items.get(index)
        if isinstance(item, Exception):
            raise item
        return super().__getitem__(index) if item is None else item


class FileDataset(PILDataset):
    """Opens image files lazily, like torchvision's ImageFolder."""

    def __init__(self, paths: list[Path]) -> None:
        super().__init__(len(paths))
        self.paths = paths

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.open(self.paths[index]).convert("RGB"), 0


class RandomDataset(ArrayDataset):
    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:  # type: ignore[override]
        return np.random.default_rng().integers(0, 256, (20, 20, 3), dtype=np.uint8), 0


def make_pil_dataset() -> PILDataset:
    return PILDataset()


ARRAY_DATASET = ArrayDataset()


def _run(dataset: Any, out: Path, options: PreprocessOptions = OPTIONS, **kw: Any) -> Any:
    kw.setdefault("workers", 1)
    return preprocess(dataset, out, options, show_progress=False, **kw)


def test_pil_dataset_matches_a_numpy_reference(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fastdata.preprocess"):
        summary = _run(PILDataset(), tmp_path / "o", workers=2)
    assert "read in this process only" not in caplog.text  # the two workers read it
    assert (summary.num_samples, summary.num_shards, summary.num_skipped) == (N, 3, 0)
    reader = ShardReader(tmp_path / "o")
    expected = np.stack([reference(pixels(i), SIDE) for i in range(N)])
    np.testing.assert_array_equal(reader.read_batch("image", np.arange(N)), expected)
    assert reader.read_batch("label", np.arange(N)).tolist() == [i % 3 for i in range(N)]
    assert [bytes(reader.read("path", i)).decode() for i in range(N)] == [str(i) for i in range(N)]
    manifest = load_manifest(tmp_path / "o")
    assert manifest.class_names == CLASSES
    assert manifest.source["kind"] == "python" and manifest.source["num_inputs"] == N
    assert manifest.source["dataset"].endswith("test_python_source.PILDataset")
    flat = expected.reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(manifest.stats["image"]["mean"], flat.mean(0), rtol=1e-9)
    np.testing.assert_allclose(manifest.stats["image"]["std"], flat.std(0), rtol=1e-6)


def _stored(out: Path) -> tuple[np.ndarray, list[int]]:
    """Every stored image and label (the files differ: each records its own job's id)."""
    reader = ShardReader(out)
    everything = np.arange(len(reader))
    return reader.read_batch("image", everything), reader.read_batch("label", everything).tolist()


def test_array_and_tensor_datasets_store_the_same_bytes_as_pil(tmp_path: Path) -> None:
    _run(PILDataset(), tmp_path / "pil")
    _run(ArrayDataset(), tmp_path / "array", workers=2)
    _run(TensorDataset(), tmp_path / "tensor")
    assert len(shard_bytes(tmp_path / "pil")) == 3
    pil_images, pil_labels = _stored(tmp_path / "pil")
    for other in ("array", "tensor"):
        images, labels = _stored(tmp_path / other)
        np.testing.assert_array_equal(images, pil_images)
        assert labels == pil_labels


def test_a_bare_array_of_images_has_no_labels(tmp_path: Path) -> None:
    images = np.stack([pixels(0)[:32, :32]] * 5)  # (5, 32, 32, 3): items are bare images
    _run(images, tmp_path / "o")
    reader = ShardReader(tmp_path / "o")
    assert [spec.name for spec in reader.fields] == ["image", "path"]
    np.testing.assert_array_equal(reader.read("image", 4), reference(images[4], SIDE))


def test_dict_dataset_with_masks_two_sizes(tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(SIDE, 8), shard_bytes=1 << 20)
    _run(DictMaskDataset(), tmp_path / "o", options)
    reader = ShardReader(tmp_path / "o")
    assert reader.field("mask").shape == (SIDE, SIDE) and reader.field("mask_8").shape == (8, 8)
    for i in (0, 5, N - 1):
        np.testing.assert_array_equal(reader.read("mask", i), reference(mask_of(i), SIDE, True))
        np.testing.assert_array_equal(reader.read("mask_8", i), reference(mask_of(i), 8, True))
        np.testing.assert_array_equal(reader.read("image_8", i), reference(pixels(i), 8))
    assert int(reader.read("label", 5)) == 2


def gradient(index: int) -> np.ndarray:
    """``(32, 34 + 2 * index, 3)`` uint8 with three distinct smooth channels (JPEG keeps it)."""
    y, x = np.mgrid[0:32, 0 : 34 + 2 * index]
    return np.stack([x * 4, y * 6, 255 - x * 3], axis=-1).astype(np.uint8)


class GradientMaskDataset(PILDataset):
    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        image = gradient(index)
        return {"image": image, "label": 0, "mask": (image[..., 0] // 50).astype(np.uint8)}


def test_jpeg_storage_with_png_masks(tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(SIDE,), storage="jpeg", jpeg_quality=95)
    _run(GradientMaskDataset(4), tmp_path / "o", options)
    reader = ShardReader(tmp_path / "o")
    assert (reader.field("image").encoding, reader.field("mask").encoding) == ("jpeg", "png")
    mask = cv2.imdecode(reader.read("mask", 3), cv2.IMREAD_UNCHANGED)
    expected_mask = reference((gradient(3)[..., 0] // 50).astype(np.uint8), SIDE, nearest=True)
    np.testing.assert_array_equal(mask, expected_mask)
    image = cv2.cvtColor(cv2.imdecode(reader.read("image", 3), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert np.abs(image.astype(int) - reference(gradient(3), SIDE)).mean() < 3  # q95, smooth


class _ClassLabel:
    names = ("no", "yes")


class HuggingFaceLike(DictMaskDataset):
    """Like ``datasets.Dataset``: dict items and ``features`` naming the label classes."""

    classes = None  # type: ignore[assignment]
    features: ClassVar[dict[str, object]] = {"image": object(), "label": _ClassLabel()}


def test_hugging_face_like_class_names(tmp_path: Path) -> None:
    _run(HuggingFaceLike(3), tmp_path / "o")
    assert load_manifest(tmp_path / "o").class_names == ["no", "yes"]


def test_image_mask_pairs_and_grayscale(tmp_path: Path) -> None:
    pairs = [(Image.fromarray(pixels(i)), Image.fromarray(mask_of(i))) for i in range(3)]
    options = PreprocessOptions(sizes=(SIDE,), grayscale=True)
    _run(pairs, tmp_path / "o", options)
    reader = ShardReader(tmp_path / "o")
    assert [spec.name for spec in reader.fields] == ["image", "mask", "path"]
    gray = cv2.cvtColor(pixels(2), cv2.COLOR_RGB2GRAY)
    np.testing.assert_array_equal(reader.read("image", 2)[..., 0], reference(gray, SIDE))
    np.testing.assert_array_equal(reader.read("mask", 2), reference(mask_of(2), SIDE, True))


class UnpicklesNowhere(ArrayDataset):
    """Pickles, but cannot be rebuilt elsewhere (as a dataset needing files only here)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("the data folder is missing here")


def test_a_dataset_workers_cannot_unpickle_is_one_clear_error(tmp_path: Path) -> None:
    spawning = engine_module.LocalEngine(2, start_method="spawn")  # forked workers unpickle nothing
    with pytest.raises(
        PreprocessError,
        match=r"a worker process cannot unpickle the dataset \(RuntimeError: the data folder",
    ):
        _run(UnpicklesNowhere(), tmp_path / "o", engine=spawning)
    assert not (tmp_path / "o" / "index.json").exists()
    _run(UnpicklesNowhere(), tmp_path / "forked", engine=engine_module.LocalEngine(2))
    _run(UnpicklesNowhere(), tmp_path / "here", workers=1)
    assert shard_bytes(tmp_path / "forked") == shard_bytes(tmp_path / "here")


class _RemoteEngine:
    """An engine that is not local (as RayEngine): its workers need the dataset pickled."""

    def run(self, tasks: Any, job: Any, advance: Any) -> Iterator[ShardResult]:
        raise AssertionError("must not run")


def test_a_remote_engine_refuses_an_unpicklable_dataset(tmp_path: Path) -> None:
    with pytest.raises(PreprocessError, match=r"_RemoteEngine sends the dataset .*cannot be pick"):
        _run(LockedDataset(), tmp_path / "o", engine=_RemoteEngine())
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_a_class_defined_on_stdin_is_read_in_the_parent_where_forking_is_unsafe(
    tmp_path: Path,
) -> None:
    """Where workers may not fork (here: as if CUDA were initialised), the warning names
    both reasons (tests/preprocess/test_forked_workers.py has the forked workers)."""
    script = textwrap.dedent(f"""
        import numpy as np
        from fastdata.preprocess import PreprocessOptions, _fork, preprocess

        _fork.cuda_is_initialised = lambda: True

        class Stdin:
            def __len__(self):
                return 6

            def __getitem__(self, index):
                return np.full((20, 24, 3), index, np.uint8), index

        summary = preprocess(Stdin(), {str(tmp_path / "o")!r}, PreprocessOptions(sizes=(8,)),
                             workers=2, show_progress=False)
        print("samples", summary.num_samples)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-"],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "samples 6" in done.stdout
    assert "Stdin is defined in __main__ of an interactive session" in done.stderr
    assert "and CUDA is initialised in this process" in done.stderr


# The one label rule, as every source states it.
_LABEL_RANGE = r"dataset\[5\] has label {}; labels must be integers in 0\.\.9223372036854775807$"


@pytest.mark.parametrize(
    ("item", "error", "message"),
    [
        ("a string", DatasetTypeError, r"dataset\[5\] is a str; expected \(image, label\)"),
        ((pixels(0), 1, None, 2), DatasetTypeError, r"dataset\[5\] is a tuple of 4 values"),
        ({"pixels": pixels(0)}, DatasetTypeError, r"dataset\[5\] is a dict with keys \['pix"),
        (
            (torch.rand(3, 8, 8), 1),
            DatasetTypeError,
            r"dataset\[5\]: the image is a float32 tensor of shape \(3, 8, 8\).*ToTensor",
        ),
        (
            (pixels(0).astype(np.float32), 1),
            DatasetTypeError,
            r"the image is a float32 ndarray of shape \(32, 34, 3\); preprocess stores uint8",
        ),
        (
            (np.zeros((3, 8, 8), np.uint8), 1),
            DatasetValueError,
            r"dataset\[5\]: the image is a uint8 ndarray of shape \(3, 8, 8\).*transpose",
        ),
        (
            (torch.zeros(4, 8, 8, dtype=torch.uint8), 1),
            DatasetValueError,
            r"tensor of shape \(4, 8, 8\); a tensor image must be \(3, H, W\)",
        ),
        (
            (Image.new("La", (8, 6)), 1),
            DatasetValueError,
            r"dataset\[5\]: the image is a PIL image \(mode La, 8x6\); PIL cannot convert mo",
        ),
        ((pixels(0), "cat"), DatasetTypeError, r"dataset\[5\]: the label is a str \('cat'\)"),
        ((pixels(0), 1.5), DatasetTypeError, r"the label is a float"),
        ((pixels(0), -1), DatasetValueError, _LABEL_RANGE.format(r"-1")),
        ((pixels(0), 2**63), DatasetValueError, _LABEL_RANGE.format(r"9223372036854775808")),
        (
            (pixels(0), np.uint64(2**63)),
            DatasetValueError,
            _LABEL_RANGE.format(r"9223372036854775808"),
        ),
        ((pixels(0), torch.tensor([-2])), DatasetValueError, _LABEL_RANGE.format(r"-2")),
        (
            (pixels(0), 1, np.zeros((5, 5), np.uint8)),
            DatasetValueError,
            r"dataset\[5\]: the mask is 5x5, its image 34x32",
        ),
        (
            (pixels(0), 1, np.full((32, 34), 300, np.int64)),
            DatasetValueError,
            r"the mask holds values 300..300",
        ),
        (
            pixels(0),
            DatasetValueError,
            r"dataset\[5\] has an image, but dataset\[0\] has an image and a label",
        ),
        ([1, 2], DatasetTypeError, r"dataset\[5\]: the image is a int; expected a PIL image"),
        (KeyError("gone"), PreprocessError, r"dataset\[5\] raised KeyError: 'gone'"),
    ],
)
def test_bad_items_name_the_index_and_what_was_found(
    tmp_path: Path, item: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        _run(PatchedDataset({5: item}), tmp_path / "o")


def test_bad_dataset_objects(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"src must be a path or a map-style dataset .*generator"):
        _run((pixels(i) for i in range(3)), tmp_path / "o")
    with pytest.raises(PreprocessError, match="the dataset has no items"):
        _run([], tmp_path / "o")
    with pytest.raises(ValueError, match=r"dataset\[0\] differs between two reads.*augment"):
        _run(RandomDataset(), tmp_path / "o")
    probed = PatchedDataset({6: (pixels(6), 0, mask_of(6))})  # N // 2 = 6 is read up front
    with pytest.raises(DatasetValueError, match=r"dataset\[6\] has an image, a label and a mas"):
        _run(probed, tmp_path / "o")
    with pytest.raises(TypeError, match=r"path must be a path \(str or os.PathLike\), got <"):
        ImageFolderSource(ArrayDataset())  # type: ignore[arg-type]


def test_unreadable_inputs_follow_on_error(tmp_path: Path) -> None:
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.jpg")
        Image.fromarray(pixels(i)).save(paths[-1])
    paths[3].write_bytes(paths[3].read_bytes()[:200])  # truncated JPEG
    summary = _run(FileDataset(paths), tmp_path / "o")
    assert (summary.num_samples, summary.num_skipped) == (5, 1)
    skipped = load_manifest(tmp_path / "o").skipped
    assert skipped[0]["path"] == "dataset[3]" and "truncated" in skipped[0]["reason"].lower()
    fail = PreprocessOptions(sizes=(SIDE,), on_error="raise")
    with pytest.raises(PreprocessError, match=r"dataset\[3\]: cannot read \(OSError: Truncated"):
        _run(FileDataset(paths), tmp_path / "f", fail, workers=2)


def _png_header_only(height: int, width: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``height x width`` (its data would
    not decode)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))


class SizedItems:
    """Items of 24x20 pixels (480) and over 1,000 pixels, as ndarrays, tensors and PIL
    images; item 4 is a PIL image opened lazily from a header claiming 4000x4000."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[Any, int]:
        small = np.full((20, 24, 3), 10 * index, np.uint8)
        big = np.full((30, 40, 3), 10 * index, np.uint8)
        forms: list[Any] = [
            small,
            big,
            torch.from_numpy(small).permute(2, 0, 1),
            torch.from_numpy(big).permute(2, 0, 1),
            Image.open(io.BytesIO(_png_header_only(4000, 4000))),
            Image.fromarray(small),
        ]
        return forms[index], index


@pytest.mark.parametrize("workers", [1, 2])
def test_max_pixels_applies_to_dataset_items(tmp_path: Path, workers: int) -> None:
    limited = PreprocessOptions(sizes=(8,), max_pixels=1000)
    summary = _run(SizedItems(), tmp_path / "o", limited, workers=workers)
    assert (summary.num_samples, summary.num_skipped) == (3, 3)
    assert _stored(tmp_path / "o")[1] == [0, 2, 5]
    reasons = {entry["path"]: entry["reason"] for entry in load_manifest(tmp_path / "o").skipped}
    over = "pixels, over the limit of 1,000 (max_pixels; raise it to accept such images)"
    assert reasons == {
        "dataset[1]": f"the image is 40x30 = 1,200 {over}",
        "dataset[3]": f"the image is 40x30 = 1,200 {over}",
        # refused from the size PIL read in the header, before decoding its (bad) data
        "dataset[4]": f"the image is 4000x4000 = 16,000,000 {over}",
    }
    raising = PreprocessOptions(sizes=(8,), max_pixels=1000, on_error="raise")
    with pytest.raises(PreprocessError, match=r"dataset\[1\]: the image is 40x30 = 1,200 pix"):
        _run(SizedItems(), tmp_path / "raise", raising)
    with pytest.raises(PreprocessError, match=r"dataset\[0\] cannot be read: the image is 24x20"):
        _run(SizedItems(), tmp_path / "first", PreprocessOptions(sizes=(8,), max_pixels=400))


# Shards of 64 MiB: a few tasks for a million tiny items.
LARGE_SHARDS = PreprocessOptions(sizes=(8,))


def _peak_bytes(work: Any) -> int:
    """The peak of Python memory allocated while ``work()`` runs (tracemalloc)."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_dataset_listing_is_a_range_not_a_list_of_items() -> None:
    """A listing of 1,000,000 indices took 270 MB before the first item was read."""
    dataset = PILDataset(1_000_000)
    made: dict[str, Any] = {}

    def plan() -> None:
        made["listing"] = listing = list_dataset(dataset)
        made["tasks"] = plan_tasks(listing, build_fields(listing, LARGE_SHARDS), LARGE_SHARDS)

    assert _peak_bytes(plan) < 5_000_000
    listing, tasks = made["listing"], made["tasks"]
    assert len(listing.items) == 1_000_000
    assert listing.items[999_999] == DatasetItem("dataset[999999]", "999999", index=999_999)
    per_shard = LARGE_SHARDS.shard_bytes // (8 * 8 * 3 + 8 + 64)  # image, label, path
    assert [len(task.items) for task in tasks[:2]] == [per_shard, per_shard]
    assert sum(len(task.items) for task in tasks) == 1_000_000
    assert tasks[1].items[0].index == len(tasks[0].items)  # type: ignore[attr-defined]


def test_workers_are_handed_a_dataset_s_items_a_chunk_at_a_time(tmp_path: Path) -> None:
    """The local engine makes items as chunks go out, not all of them up front."""
    listing = list_dataset(PILDataset(1_000_000))
    fields = build_fields(listing, LARGE_SHARDS)
    job = ShardJob(str(tmp_path), LARGE_SHARDS, fields, listing.kind, loader=listing.loader)
    tasks = [ShardTask(0, listing.items[:40]), ShardTask(1, listing.items[40:])]
    first: list[ShardResult] = []

    def first_shard() -> None:
        results = LocalEngine(2).run(tasks, job, lambda count: None)
        first.append(next(iter(results)))
        results.close()  # type: ignore[attr-defined]

    assert _peak_bytes(first_shard) < 20_000_000
    assert first[0].info.num_samples == 40


def test_a_dataset_claiming_2_to_the_62_items_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(
        PreprocessError,
        match=r"4,611,686,018,427,387,904 inputs of about 264 bytes each make "
        r"18,[0-9,]+ shards of shard_bytes=67,108,864, more than the 1,000,000 one job writes",
    ):
        _run(PILDataset(2**62), tmp_path / "o", LARGE_SHARDS)
    assert not (tmp_path / "o").exists()


def test_identical_runs_give_identical_bytes(tmp_path: Path) -> None:
    _run(DictMaskDataset(), tmp_path / "a")
    time.sleep(1.1)  # HDF5 timestamps have one-second resolution
    _run(DictMaskDataset(), tmp_path / "b", workers=2)
    a, b = load_manifest(tmp_path / "a"), load_manifest(tmp_path / "b")
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert a.shards == b.shards and a.stats == b.stats and a.source == b.source


def _crash_after(shards: int) -> Any:
    original_run = engine_module.LocalEngine.run

    def run(self: Any, tasks: Any, job: Any, advance: Any) -> Iterator[ShardResult]:
        for count, result in enumerate(original_run(self, tasks, job, advance), start=1):
            yield result
            if count == shards:
                raise KeyboardInterrupt

    return run


def test_resume_keeps_finished_shards_and_a_changed_dataset_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "o"
    with monkeypatch.context() as patch:
        patch.setattr(engine_module.LocalEngine, "run", _crash_after(1))
        with pytest.raises(KeyboardInterrupt):
            _run(ArrayDataset(), out)
    assert sorted(shard_bytes(out)) == ["shard-00000.h5"]
    changed = PatchedDataset({N - 1: (pixels(0), 0)})  # the last item differs
    with pytest.raises(PreprocessError, match="holds the output of another job"):
        _run(changed, out)
    summary = _run(ArrayDataset(), out)
    assert (summary.num_reused_shards, summary.num_processed, summary.num_samples) == (1, 8, N)
    _run(ArrayDataset(), tmp_path / "clean")
    assert shard_bytes(out) == shard_bytes(tmp_path / "clean")
    assert load_manifest(out).stats == load_manifest(tmp_path / "clean").stats


def test_cli_from_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = "tests.preprocess.test_python_source"
    args = ["--size", "16", "-q", "--workers", "1"]
    factory = f"{module}:make_pil_dataset"  # a function returning a dataset
    assert main(["preprocess", "--from-python", factory, str(tmp_path / "a"), *args]) == 0
    assert f"{N} samples in 1 shard(s)" in capsys.readouterr().out
    instance = f"{module}:ARRAY_DATASET"  # the flag may come after the positionals
    assert main(["preprocess", instance, str(tmp_path / "b"), "--from-python", *args]) == 0
    np.testing.assert_array_equal(_stored(tmp_path / "a")[0], _stored(tmp_path / "b")[0])


def test_cli_from_python_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "my_data_module.py").write_text(
        "import numpy as np\nclass Tiny:\n    def __len__(self):\n        return 3\n"
        "    def __getitem__(self, i):\n        return np.full((9, 9, 3), i, np.uint8), i\n"
    )
    spec = f"{tmp_path / 'my_data_module.py'}:Tiny"  # a class: called with no arguments
    argv = ["preprocess", "--from-python", spec, str(tmp_path / "o"), "--size", "4", "-q"]
    assert main(argv) == 0
    assert "3 samples in 1 shard(s)" in capsys.readouterr().out
    monkeypatch.delitem(sys.modules, "my_data_module")


class LenRaises:
    """A dataset whose ``len()`` fails (e.g. its index file is missing)."""

    def __len__(self) -> int:
        raise RuntimeError("index file missing")

    def __getitem__(self, index: int) -> Any:
        raise AssertionError("never read")


class ClassesRaise(ArrayDataset):
    @property
    def classes(self) -> list[str]:
        raise KeyError("no labels.txt")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        ([f"{__name__}:LenRaises"], 1, r"len\(\) of the dataset \(LenRaises\) raised Runtime"),
        ([f"{__name__}:ClassesRaise"], 1, r"class names \(.classes, .features\) raised KeyError"),
        (["no_colon"], 1, "--from-python takes module:attribute"),
        (["no_such_module_xyz:data"], 1, "cannot import 'no_such_module_xyz' \\(ModuleNotFound"),
        ([f"{__name__}:nothing"], 1, "has no attribute 'nothing'"),
        ([f"{__name__}:CLASSES"], 1, r"dataset\[0\] is a str"),
        ([f"{__name__}:ArrayDataset", "--kind", "list"], 2, "--kind and --masks"),
    ],
)
def test_cli_from_python_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    argv = ["preprocess", "--from-python", argv[0], str(tmp_path / "o"), "-q", *argv[1:]]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err


@pytest.mark.parametrize("exit_call", ["sys.exit(3)", "sys.exit('usage: data.py DIR')"])
def test_cli_from_python_module_that_exits_on_import(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    exit_call: str,
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "exits_on_import.py").write_text(f"import sys\n{exit_call}\n")
    spec = f"{tmp_path / 'exits_on_import.py'}:dataset"
    argv = ["preprocess", "--from-python", spec, str(tmp_path / "o"), "--size", "4", "-q"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"importing 'exits_on_import' called {exit_call}" in err
    monkeypatch.delitem(sys.modules, "exits_on_import", raising=False)


def test_preprocessing_guide_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_docs import GUIDES, blocks  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)
    page = GUIDES / "preprocess.md"
    (code,) = [block for block in blocks(page, "python") if "class Gradients:" in block]
    exec(compile(code, str(page), "exec"), {"__name__": "__main__"})  # runs the guarded job
    reader = ShardReader(tmp_path / "out-gradients")
    assert len(reader) == 100 and reader.field("image").shape == (32, 32, 3)
    assert int(reader.read("label", 50)) == 1 and reader.read("image", 3)[0, 0, 0] == 6
    assert load_manifest(tmp_path / "out-gradients").class_names == ["dark", "light"]


class OpenedFiles:
    """Items ``(PIL.Image.open(path), 0)``, as a dataset over image files gives them."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.open(self.paths[index]), 0


def _sixteen_bit_pngs(folder: Path) -> list[Path]:
    """16-bit PNGs spanning 0..65535, gray and RGB (written by OpenCV, BGR order)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    paths = []
    for k, shape in enumerate([(32, 34), (36, 32), (32, 34, 3), (34, 32, 3)]):
        path = folder / f"{k:02d}.png"
        cv2.imwrite(str(path), rng.integers(0, 65536, shape, dtype=np.uint16))
        paths.append(path)
    return paths


def test_sixteen_bit_images_store_the_same_pixels_from_a_dataset_as_from_files(
    tmp_path: Path,
) -> None:
    paths = _sixteen_bit_pngs(tmp_path / "src" / "only")
    assert {Image.open(path).mode for path in paths} == {"I;16", "RGB"}
    _run(OpenedFiles(paths), tmp_path / "dataset")
    preprocess(tmp_path / "src", tmp_path / "files", OPTIONS, workers=1, show_progress=False)
    from_dataset, _ = _stored(tmp_path / "dataset")
    from_files, _ = _stored(tmp_path / "files")
    np.testing.assert_array_equal(from_dataset, from_files)
    assert len(np.unique(from_dataset)) > 100  # scaled to 8 bits, not clipped at 255


@pytest.mark.parametrize(
    ("pixels_of_mode", "mode"),
    [(np.full((32, 34), 70000, np.int32), "I"), (np.full((32, 34), 0.5, np.float32), "F")],
)
def test_wide_images_are_refused_naming_the_mode_from_a_dataset_as_from_files(
    tmp_path: Path, pixels_of_mode: np.ndarray, mode: str
) -> None:
    path = tmp_path / "src" / "only" / "wide.tiff"
    path.parent.mkdir(parents=True)
    Image.fromarray(pixels_of_mode).save(path)
    assert Image.open(path).mode == mode
    message = rf"PIL mode {mode} \(32-bit .* pixels\) has no one 8-bit reading"
    with pytest.raises(DatasetValueError, match=rf"dataset\[0\]: .*{message}"):
        _run(OpenedFiles([path]), tmp_path / "dataset")
    with pytest.raises(PreprocessError, match=rf"wide\.tiff: {message}"):
        strict = dataclasses.replace(OPTIONS, on_error="raise")
        preprocess(tmp_path / "src", tmp_path / "files", strict, workers=1, show_progress=False)

"""Shard tasks: pure functions from a slice of the source to one shard file.

A :class:`ShardTask` names its shard and the items it holds. :func:`process_sample` turns
one item into the values stored for it (no side effects), and :func:`write_shard` writes
one shard from those values in item order. :func:`run_shard_task` chains the two: it is
what a remote engine (Ray) runs; the local engine runs :func:`process_sample` in a process
pool and :func:`write_shard` in the parent. Both give byte-identical shards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import cv2
import numpy as np
from PIL import Image

from fastdata._codec import decode_image, jpeg_size
from fastdata.errors import DecodeError, PreprocessError
from fastdata.preprocess._options import PreprocessOptions
from fastdata.preprocess._sources import SourceItem, SourceListing
from fastdata.preprocess._transforms import decode_min_side, transform
from fastdata.shards import FieldSpec, ShardInfo, ShardWriter

logger = logging.getLogger(__name__)

# Per field: (number of pixels, per-channel sum, per-channel sum of squares).
PixelStats = dict[str, tuple[float, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class SampleFailure:
    """An input that could not be read or decoded."""

    path: str
    reason: str


SampleResult = Union[tuple[dict[str, Any], PixelStats], SampleFailure]  # noqa: UP007


@dataclass(frozen=True)
class ShardJob:
    """What every task of one job shares (small and picklable)."""

    out: str
    options: PreprocessOptions
    fields: tuple[FieldSpec, ...]
    source_kind: str


@dataclass(frozen=True)
class ShardTask:
    """Shard number ``index`` holds ``items``, in order."""

    index: int
    items: tuple[SourceItem, ...]

    @property
    def file(self) -> str:
        return f"shard-{self.index:05d}.h5"


@dataclass
class ShardResult:
    """A written shard: its manifest entry, pixel statistics and skipped inputs."""

    index: int
    info: ShardInfo
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "info": self.info.to_json(),
            "stats": self.stats,
            "skipped": self.skipped,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardResult:
        return cls(data["index"], ShardInfo(**data["info"]), data["stats"], data["skipped"])


def field_names(prefix: str, sizes: tuple[int, ...]) -> list[str]:
    """``image``, ``image_<side>``...: the field of each output size, first one unsuffixed."""
    return [prefix] + [f"{prefix}_{side}" for side in sizes[1:]]


def build_fields(listing: SourceListing, options: PreprocessOptions) -> tuple[FieldSpec, ...]:
    """The schema of a job's shards."""
    if listing.kind == "npy":
        shape = listing.array_shape
        layout = {2: "HW", 3: "DHW", 4: "DHWC"}.get(len(shape), "")
        fields = [FieldSpec("volume", "array", listing.array_dtype, shape, layout)]
    else:
        channels = 1 if options.grayscale else 3
        fields = []
        for name, side in zip(field_names("image", options.sizes), options.sizes, strict=True):
            if options.storage == "raw":
                fields.append(FieldSpec(name, "array", "uint8", (side, side, channels), "HWC"))
            else:
                fields.append(FieldSpec(name, "encoded", "uint8", encoding="jpeg"))
        if listing.kind == "segmentation":
            for name, side in zip(field_names("mask", options.sizes), options.sizes, strict=True):
                if options.storage == "raw":
                    fields.append(FieldSpec(name, "array", "uint8", (side, side), "HW"))
                else:
                    fields.append(FieldSpec(name, "encoded", "uint8", encoding="png"))
    if listing.has_labels:
        fields.append(FieldSpec("label", "array", "int64"))
    fields.append(FieldSpec("path", "encoded", "uint8", encoding="utf-8"))
    return tuple(fields)


def _pixel_stats(pixels: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    count = float(pixels.shape[0] * pixels.shape[1])
    mean, std = cv2.meanStdDev(pixels)
    mean, std = mean.ravel(), std.ravel()
    return count, mean * count, (std * std + mean * mean) * count


def _read_mask(path: str, image_hw: tuple[int, int]) -> np.ndarray:
    with Image.open(path) as pil:
        if pil.mode not in ("L", "P", "1"):
            raise DecodeError(f"mask must be single-channel (L or P mode), got {pil.mode}", path)
        mask = np.asarray(pil.convert("L") if pil.mode == "1" else pil, dtype=np.uint8)
    if mask.shape != image_hw:
        raise DecodeError(f"mask is {mask.shape}, its image is {image_hw}", path)
    return mask


def _encode(pixels: np.ndarray, ext: str, quality: int, source: str) -> bytes:
    if pixels.ndim == 3 and pixels.shape[2] == 3:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    elif pixels.ndim == 3:
        pixels = pixels[..., 0]
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext == ".jpg" else []
    ok, encoded = cv2.imencode(ext, pixels, params)
    if not ok:
        raise DecodeError(f"cannot encode as {ext}", source)
    return encoded.tobytes()


def _process_image(item: SourceItem, job: ShardJob) -> SampleResult:
    options = job.options
    data = Path(item.path).read_bytes()
    header_hw = jpeg_size(data)
    min_side = None
    if header_hw is not None:
        min_side = max(decode_min_side(s, options.resize, *header_hw) for s in options.sizes)
    image = decode_image(data, min_side=min_side, grayscale=options.grayscale, source=item.path)
    if image.ndim == 2:
        image = image[..., None]
    mask = None
    if item.mask is not None:
        mask = _read_mask(item.mask, header_hw or image.shape[:2])
    sample: dict[str, Any] = {}
    stats: PixelStats = {}
    names = field_names("image", options.sizes)
    mask_names = field_names("mask", options.sizes)
    for name, mask_name, side in zip(names, mask_names, options.sizes, strict=True):
        pixels = transform(image, side, options.resize)
        stats[name] = _pixel_stats(pixels)
        if options.storage == "raw":
            sample[name] = pixels
        else:
            sample[name] = _encode(pixels, ".jpg", options.jpeg_quality, item.path)
        if mask is not None:
            small = transform(mask, side, options.resize, nearest=True)
            sample[mask_name] = (
                small if options.storage == "raw" else _encode(small, ".png", 0, item.mask or "")
            )
    return sample, stats


def _process_array(item: SourceItem, spec: FieldSpec) -> SampleResult:
    array = np.load(item.path, allow_pickle=False)
    if array.shape != spec.shape or array.dtype != np.dtype(spec.dtype):
        raise DecodeError(
            f"array is {array.shape} {array.dtype}, expected {spec.shape} {spec.dtype}", item.path
        )
    flat = array.reshape(-1, 1).astype(np.float64)
    count = float(flat.shape[0])
    return {"volume": array}, {"volume": (count, flat.sum(0), (flat * flat).sum(0))}


def process_sample(item: SourceItem, job: ShardJob) -> SampleResult:
    """The stored values of one input (a pure function of ``item`` and ``job``).

    Returns:
        ``(values, stats)``: a value per field (uint8 arrays for ``raw``, bytes for
        encoded fields) and per image field the pixel count, per-channel sum and sum of
        squares; or a :class:`SampleFailure` for an unreadable or undecodable input.
    """
    try:
        if job.source_kind == "npy":
            sample, stats = _process_array(item, job.fields[0])  # type: ignore[misc]
        else:
            sample, stats = _process_image(item, job)  # type: ignore[misc]
    except DecodeError as exc:
        return SampleFailure(item.path, str(exc).removesuffix(f": {exc.source}"))
    except (OSError, ValueError) as exc:
        return SampleFailure(item.path, f"cannot read ({exc})")
    sample["path"] = item.name
    if item.label >= 0:
        sample["label"] = item.label
    return sample, stats


def write_shard(task: ShardTask, job: ShardJob, results: Iterable[SampleResult]) -> ShardResult:
    """Write ``task``'s shard atomically from the results of its items, in item order.

    Raises:
        PreprocessError: ``on_error="fail"`` and an input failed, or the shard cannot be
            written (disk full, permissions). Nothing of the shard is left on disk then.
    """
    path = Path(job.out) / task.file
    totals: dict[str, list[Any]] = {}
    skipped: list[dict[str, str]] = []
    try:
        with ShardWriter(
            path, job.fields, compression=job.options.compression, max_samples=len(task.items)
        ) as writer:
            for result in results:
                if isinstance(result, SampleFailure):
                    if job.options.on_error == "fail":
                        raise PreprocessError(
                            f"{result.path}: {result.reason} "
                            "(--on-error skip / on_error='skip' leaves such inputs out)"
                        )
                    logger.warning("skipped %s: %s", result.path, result.reason)
                    skipped.append({"path": result.path, "reason": result.reason})
                    continue
                sample, stats = result
                writer.append(sample)
                for name, (count, sums, squares) in stats.items():
                    total = totals.setdefault(name, [0, 0.0, 0.0, 0.0])
                    total[0] += 1
                    total[1] += count
                    total[2] = total[2] + sums
                    total[3] = total[3] + squares
            info = writer.close()
    except OSError as exc:
        raise PreprocessError(f"cannot write shard {path}: {exc}") from exc
    stats_json = {
        name: {
            "count": n,
            "pixels": pixels,
            "sum": np.asarray(s).tolist(),
            "sumsq": np.asarray(q).tolist(),
        }
        for name, (n, pixels, s, q) in totals.items()
    }
    return ShardResult(task.index, info, stats_json, skipped)


def run_shard_task(task: ShardTask, job: ShardJob) -> ShardResult:
    """Process and write one shard in this process: the unit a distributed engine runs."""
    return write_shard(task, job, (process_sample(item, job) for item in task.items))

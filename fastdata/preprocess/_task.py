"""Shard tasks: pure functions from a slice of the source to one shard file.

A :class:`ShardTask` names its shard and the items it holds. :func:`process_sample` turns
one item into the values stored for it (no side effects), and :func:`write_shard` writes
one shard from those values in item order. :func:`run_shard_task` chains the two: it is
what a remote engine (Ray) runs; the local engine runs :func:`process_sample` in a process
pool and :func:`write_shard` in the parent. Both give byte-identical shards.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Union, cast

import cv2
import numpy as np
from PIL import Image

from fastdata._codec import JpegHeader, check_pixels, decode_image, jpeg_header, orient
from fastdata._storage import read_input
from fastdata.errors import DecodeError, OnError, PreprocessError, StorageError
from fastdata.preprocess._options import PreprocessOptions
from fastdata.preprocess._sources import SourceItem, SourceListing, display_name
from fastdata.preprocess._stats import PixelStats, StatsTotals
from fastdata.preprocess._transforms import decode_min_side, transform, transform_boxes
from fastdata.shards import FieldSpec, ShardInfo

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleFailure:
    """An input that could not be read or decoded."""

    path: str
    reason: str


# The key of a sample's values under which a damaged JPEG that was kept carries what libjpeg
# said (not a field: no field name starts with a NUL).
DAMAGED_NOTE = "\0damaged"

SampleResult = Union[tuple[dict[str, Any], dict[str, PixelStats]], SampleFailure]  # noqa: UP007


class SampleLoader(Protocol):
    """Reads the inputs of a source that is not files (a Python dataset object).

    ``process_sample(item, job)`` loads ``item`` into decoded uint8 pixels and hands them
    to :func:`process_pixels`, so such a source shares the offline transforms, statistics
    and encoding of the file sources. Implemented by ``_python_source.DatasetLoader``.
    """

    def process_sample(self, item: SourceItem, job: ShardJob) -> SampleResult: ...


@dataclass(frozen=True)
class ShardJob:
    """What every task of one job shares (picklable; small except for ``loader``, which
    carries a pickled dataset object to the workers once per process)."""

    out: str
    options: PreprocessOptions
    fields: tuple[FieldSpec, ...]
    source_kind: str
    job_id: str = ""  # written into every shard; readers compare it with the manifest
    loader: SampleLoader | None = None


@dataclass(frozen=True)
class ShardTask:
    """Shard number ``index`` holds ``items``, in order (a tuple of files, or a range of a
    dataset's items); ``inputs`` digests their sizes and modification times (a changed
    input makes the shard stale)."""

    index: int
    items: Sequence[SourceItem]
    inputs: str = ""

    @property
    def file(self) -> str:
        return f"shard-{self.index:05d}.h5"


@dataclass
class ShardResult:
    """A written shard: its manifest entry, pixel statistics and skipped inputs."""

    index: int
    info: ShardInfo
    stats: dict[str, PixelStats] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "info": self.info.to_json(),
            "stats": {name: stats.to_json() for name, stats in self.stats.items()},
            "skipped": self.skipped,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardResult:
        info = ShardInfo.from_json(data["info"], "info")
        stats = {name: PixelStats.from_json(part) for name, part in data["stats"].items()}
        return cls(data["index"], info, stats, data["skipped"])


def field_names(prefix: str, sizes: tuple[int, ...]) -> list[str]:
    """``image``, ``image_<side>``...: the field of each output size, first one unsuffixed."""
    return [prefix] + [f"{prefix}_{side}" for side in sizes[1:]]


def build_fields(listing: SourceListing, options: PreprocessOptions) -> tuple[FieldSpec, ...]:
    """The schema of a job's shards."""
    if listing.kind == "npy":
        shape = listing.array_shape
        axes = {2: "HW", 3: "DHW", 4: "DHWC"}.get(len(shape), "")
        fields = [FieldSpec("volume", "array", listing.array_dtype, shape, axes)]
    else:
        channels = 1 if options.grayscale else 3
        fields = []
        for name, side in zip(field_names("image", options.sizes), options.sizes, strict=True):
            if options.storage == "raw" and options.resize == "keep":
                fields.append(
                    FieldSpec(name, "ragged_image", "uint8", (channels,), "HWC", role="image")
                )
            elif options.storage == "raw":
                fields.append(
                    FieldSpec(name, "array", "uint8", (side, side, channels), "HWC", role="image")
                )
            else:
                fields.append(FieldSpec(name, "encoded", "uint8", encoding="jpeg", role="image"))
        if listing.kind == "segmentation" or getattr(listing, "has_masks", False):
            for name, side in zip(field_names("mask", options.sizes), options.sizes, strict=True):
                if options.storage == "raw" and options.resize == "keep":
                    fields.append(FieldSpec(name, "ragged_image", "uint8", (), "HW", role="mask"))
                elif options.storage == "raw":
                    fields.append(
                        FieldSpec(name, "array", "uint8", (side, side), "HW", role="mask")
                    )
                else:
                    fields.append(FieldSpec(name, "encoded", "uint8", encoding="png", role="mask"))
        for key, dtype, tail in getattr(listing, "target_fields", ()):
            role = {"boxes": "boxes", "labels": "box_labels"}.get(key, "other")
            for name in field_names(key, options.sizes):
                fields.append(FieldSpec(name, "ragged", dtype, tail, role=role))
    if listing.has_labels:
        fields.append(FieldSpec("label", "array", "int64", role="label"))
    fields.append(FieldSpec("path", "encoded", "uint8", encoding="utf-8", role="path"))
    return tuple(fields)


def _read_mask(
    path: str, header: JpegHeader | None, image_hw: tuple[int, int], max_pixels: int | None
) -> np.ndarray:
    """The mask of an image, aligned with the image as decoded (EXIF orientation applied).

    One rule: the mask gets its image's EXIF flip/rotation, as the image does, unless its
    size already is the image's displayed size and not its stored size (a mask drawn on
    the displayed photo). Its size must then equal the displayed image's.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as pil:
                check_pixels((pil.size[1], pil.size[0]), max_pixels, path)
                if pil.mode not in ("L", "P", "1"):
                    raise DecodeError(
                        f"mask must be single-channel (L or P mode), got {pil.mode}",
                        path,
                        "not_an_image",
                    )
                mask = np.asarray(pil.convert("L") if pil.mode == "1" else pil, dtype=np.uint8)
    except (DecodeError, MemoryError, OSError):  # OSError: unreadable, not an image
        raise
    except Exception as exc:  # PIL raises many types on crafted files (bombs, SyntaxError...)
        raise DecodeError(f"cannot decode mask ({type(exc).__name__}: {exc})", path) from exc
    orientation = 1 if header is None else header.orientation
    if orientation != 1 and header is not None:
        stored = (header.height, header.width)
        if not (mask.shape == header.oriented_hw and mask.shape != stored):
            mask = orient(mask, orientation)
    if mask.shape != image_hw:
        raise DecodeError(f"mask is {mask.shape}, its image is {image_hw}", path, "mismatch")
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


def _process_image(
    item: SourceItem, job: ShardJob, into: Mapping[str, np.ndarray] | None
) -> SampleResult:
    options = job.options
    data = read_input(item.path)  # a local file, or an object of the store by URL
    header = jpeg_header(data)
    min_side = None
    if header is not None:
        hw = header.oriented_hw
        min_side = max(decode_min_side(s, options.resize, *hw) for s in options.sizes)
    # "warn" keeps a damaged JPEG that decodes, and says so; other policies refuse it
    damaged: list[DecodeError] | None = [] if options.on_error is OnError.WARN else None
    image = decode_image(
        data,
        min_side=min_side,
        grayscale=options.grayscale,
        max_pixels=options.max_pixels,
        source=item.path,
        damaged=damaged,
    )

    if image.ndim == 2:
        image = image[..., None]
    mask = None
    if item.mask is not None:
        full_hw = header.oriented_hw if header is not None else image.shape[:2]
        mask = _read_mask(item.mask, header, full_hw, options.max_pixels)
    result = process_pixels(image, mask, job, item.path, item.mask or "", into=into)
    if damaged:  # reported where the shard is written (worker processes do not log)
        result[0][DAMAGED_NOTE] = damaged[0].message
    return result


def process_pixels(
    image: np.ndarray,
    mask: np.ndarray | None,
    job: ShardJob,
    source: str,
    mask_source: str = "",
    *,
    into: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, PixelStats]]:
    """The stored image (and mask) values of one decoded input: offline transforms,
    pixel statistics and, for ``jpeg`` storage, encoding.

    Args:
        image: ``(H, W, C)`` uint8 pixels, ``C = 1`` with ``options.grayscale`` else 3 (RGB).
        mask: ``(H, W)`` uint8 class ids, or ``None``.
        job: The job (its options decide sizes, resize mode and storage).
        source: Where the image came from, for error messages.
        mask_source: Where the mask came from, for error messages.
        into: Per raw image or mask field, a C-contiguous array of the field's shape to
            write its pixels into (a worker's shared-memory slot), where the resize mode
            allows (``exact``, ``shorter``): the value returned for that field is then
            that array itself.

    Returns:
        ``(values, stats)`` as :func:`process_sample` returns them, without ``path``/``label``.
    """
    options = job.options
    sample: dict[str, Any] = {}
    stats: dict[str, PixelStats] = {}
    names = field_names("image", options.sizes)
    mask_names = field_names("mask", options.sizes)
    raw = options.storage == "raw"
    into = into if raw and into is not None else {}
    for name, mask_name, side in zip(names, mask_names, options.sizes, strict=True):
        pixels = transform(image, side, options.resize, out=into.get(name))
        stats[name] = PixelStats.of_image(pixels)
        if raw:
            sample[name] = pixels
        else:
            sample[name] = _encode(pixels, ".jpg", options.jpeg_quality, source)
        if mask is not None:
            small = transform(mask, side, options.resize, nearest=True, out=into.get(mask_name))
            sample[mask_name] = (
                small if options.storage == "raw" else _encode(small, ".png", 0, mask_source)
            )
    return sample, stats


def place_targets(
    targets: dict[str, np.ndarray], image_hw: tuple[int, int], options: PreprocessOptions
) -> dict[str, np.ndarray]:
    """The stored target fields: per output size the boxes where the offline resize puts
    them (``boxes``, ``boxes_<side>``...), and the labels and per-box entries of the boxes
    kept (``labels``, ``labels_<side>``...).

    Args:
        targets: ``"boxes"`` ``(N, 4)`` float32 xyxy in pixels of the decoded image, and
            per-box arrays with ``N`` rows (``"labels"``, ``"iscrowd"``...).
        image_hw: ``(height, width)`` of the decoded image.
        options: The job's options (sizes and resize mode).
    """
    out: dict[str, np.ndarray] = {}
    for position, side in enumerate(options.sizes):
        boxes, keep = transform_boxes(targets["boxes"], *image_hw, side, options.resize)
        for key, array in targets.items():
            name = key if position == 0 else f"{key}_{side}"
            out[name] = boxes if key == "boxes" else array[keep]
    return out


def _process_array(item: SourceItem, spec: FieldSpec) -> SampleResult:
    array = np.load(item.path, allow_pickle=False)
    if array.shape != spec.shape or array.dtype.newbyteorder("=") != np.dtype(spec.dtype):
        raise DecodeError(
            f"array is {array.shape} {array.dtype}, expected {spec.shape} {spec.dtype}",
            item.path,
            "mismatch",
        )
    if not array.dtype.isnative:  # e.g. big-endian uint16 beside little-endian ones
        array = array.astype(array.dtype.newbyteorder("="))
    return {"volume": array}, {"volume": PixelStats.of_array(array)}


def process_sample(
    item: SourceItem, job: ShardJob, into: Mapping[str, np.ndarray] | None = None
) -> SampleResult:
    """The stored values of one input (a pure function of ``item`` and ``job``).

    ``into``: where a raw image or mask field's pixels may be written instead of a new
    array (see :func:`process_pixels`); a file source uses it, a dataset object's loader
    does not.

    Returns:
        ``(values, stats)``: a value per field (uint8 arrays for ``raw``, bytes for
        encoded fields) and per image field its :class:`PixelStats`; or a
        :class:`SampleFailure` for an unreadable or undecodable input.
    """
    if job.loader is not None:
        return job.loader.process_sample(item, job)
    try:
        if job.source_kind == "npy":
            sample, stats = _process_array(item, job.fields[0])  # type: ignore[misc]
        else:
            sample, stats = _process_image(item, job, into)  # type: ignore[misc]
    except DecodeError as exc:
        return SampleFailure(display_name(item.path), display_name(exc.message))
    except cv2.error as exc:  # a decoder or resize refusing the pixels
        reason = f"cannot decode (OpenCV: {str(exc).strip()[-200:]})"
        return SampleFailure(display_name(item.path), reason)
    except (OSError, ValueError) as exc:
        return SampleFailure(display_name(item.path), display_name(f"cannot read ({exc})"))
    except StorageError as exc:  # an object of the store refused (access denied...)
        return SampleFailure(display_name(item.path), display_name(f"cannot read ({exc})"))
    sample["path"] = item.name
    if item.label >= 0:
        sample["label"] = item.label
    return sample, stats


def write_shard(task: ShardTask, job: ShardJob, results: Iterable[SampleResult]) -> ShardResult:
    """Write ``task``'s shard atomically from the results of its items, in item order.

    Raises:
        PreprocessError: ``on_error="raise"`` and an input failed, or the shard cannot be
            written (disk full, permissions). Nothing of the shard is left on disk then.
    """
    # here, not at the top: the worker processes import this module and need no h5py
    from fastdata.shards import ShardWriter  # noqa: PLC0415

    path = Path(job.out) / task.file
    on_error = cast(OnError, job.options.on_error)  # PreprocessOptions parsed it
    totals = StatsTotals()
    skipped: list[dict[str, str]] = []
    try:
        with ShardWriter(
            path,
            job.fields,
            compression=job.options.compression,
            job=job.job_id,
            inputs=task.inputs,
            max_samples=len(task.items),
        ) as writer:
            for result in results:
                if isinstance(result, SampleFailure):
                    failure = f"{result.path}: {result.reason}"
                    if on_error is OnError.RAISE:
                        raise PreprocessError(
                            f"{failure} (--on-error skip / on_error='skip' leaves such inputs out)"
                        )
                    on_error.handle(PreprocessError(failure), log=logger)
                    skipped.append({"path": result.path, "reason": result.reason})
                    continue
                sample, stats = result
                note = sample.pop(DAMAGED_NOTE, None)
                if note is not None:
                    kept = DecodeError(note, str(sample.get("path", "")), kept=True)
                    on_error.handle(kept, log=logger)
                writer.append(sample)
                totals.add(stats)
            info = writer.close()
    except OSError as exc:
        raise PreprocessError(f"cannot write shard {path}: {exc}") from exc
    return ShardResult(task.index, info, totals.result(), skipped)


def run_shard_task(task: ShardTask, job: ShardJob) -> ShardResult:
    """Process and write one shard in this process: the unit a distributed engine runs."""
    return write_shard(task, job, (process_sample(item, job) for item in task.items))

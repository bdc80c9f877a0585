"""Detection crops decoded in one step: a batch of encoded images cut by
:class:`fastdata.ops.RandomIoUCrop` while decoding and resized to one size, the boxes
moved from the same crops.

The IoU crop needs the image sizes and the boxes before any pixel: the sizes come from
the headers (JPEG: as displayed, EXIF orientation applied; PNG and others: as stored;
an image whose header gives none is decoded first), the boxes from the sample, so the crop
is drawn first (:func:`plan_iou_crops`, one vectorised call per batch) and the decoder
decodes and resamples only what it keeps (:func:`decode_into_iou_crop`; at 1/2, 1/4 or
1/8 DCT scale when the crop is at least twice the output). The crops returned are what
the boxes follow (``Geometry.of(crops, ...)`` and the CPU movers).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import NamedTuple

import numpy as np

from fastdata._codec import (
    DEFAULT_MAX_PIXELS,
    JpegHeader,
    decode_image,
    image_size,
    jpeg_header,
    reduction_factors,
)
from fastdata._threads import parallel_for
from fastdata.decode._geometry import Box
from fastdata.errors import DecodeError
from fastdata.ops import RandomIoUCrop


class PlannedIoUCrop(NamedTuple):
    """One image's IoU crop, planned before decoding.

    Attributes:
        header: The JPEG header, or ``None`` for another format.
        crop: ``(top, left, height, width)`` in the image's pixels; ``None`` when the
            header gave no size (drawn once the image is decoded).
        factor: The DCT scale to decode a JPEG at (1, 2, 4 or 8).
    """

    header: JpegHeader | None
    crop: tuple[int, int, int, int] | None
    factor: int


def plan_iou_crops(
    buffers: Sequence[np.ndarray],
    boxes: Sequence[np.ndarray],
    crop: RandomIoUCrop,
    draws: np.ndarray,
    out_size: tuple[int, int],
) -> list[PlannedIoUCrop]:
    """The crops and DCT scales of a batch of encoded images (``(B, draws_per_sample)``
    uniforms, row ``k`` for image ``k``, as the transform draws them)."""
    headers = [jpeg_header(buffer) for buffer in buffers]
    sizes: list[tuple[int, int] | None] = []
    for buffer, header in zip(buffers, headers, strict=True):
        if header is not None:
            sizes.append(header.oriented_hw)
            continue
        try:
            sizes.append(image_size(buffer))
        except DecodeError:  # refused again, and reported, when it is decoded
            sizes.append(None)
    known = [k for k, size in enumerate(sizes) if size is not None]
    plans = [PlannedIoUCrop(header, None, 1) for header in headers]
    if not known:
        return plans
    hw = np.array([sizes[k] or (0, 0) for k in known], np.int64).reshape(-1, 2)
    rows = crop.crops(hw[:, 0], hw[:, 1], [boxes[k] for k in known], draws[known])
    factors = reduction_factors(rows[:, 2:4], out_size).tolist()
    for row, k in enumerate(known):
        top, left, height, width = rows[row].tolist()
        factor = int(factors[row]) if headers[k] is not None else 1
        plans[k] = PlannedIoUCrop(headers[k], (top, left, height, width), factor)
    return plans


def decode_into_iou_crop(
    buffer: np.ndarray,
    planned: PlannedIoUCrop,
    boxes: np.ndarray,
    crop: RandomIoUCrop,
    *,
    draws: np.ndarray,
    out: np.ndarray,
    source: str = "<bytes>",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    damaged: list[DecodeError] | None = None,
) -> tuple[int, int, int, int]:
    """Decode one image's planned crop into ``out`` (``(H, W, C)`` uint8, C-contiguous),
    resized to ``out``'s size; returns the crop. An image planned without a crop (no size
    in its header) is decoded first, and its crop drawn from ``draws`` (its row) and
    ``boxes`` then.

    Raises:
        fastdata.errors.DecodeError: The bytes do not decode.
    """
    from fastdata.decode.cpu import decode_jpeg_box, resize_crop  # noqa: PLC0415 - a cycle

    grayscale = out.shape[2] == 1
    if planned.header is not None and planned.crop is not None:
        decode_jpeg_box(
            buffer,
            planned.header,
            Box(*planned.crop),
            planned.factor,
            out,
            grayscale=grayscale,
            source=source,
            max_pixels=max_pixels,
            damaged=damaged,
        )
        return planned.crop
    image = decode_image(
        buffer, grayscale=grayscale, source=source, max_pixels=max_pixels, damaged=damaged
    )
    region = planned.crop
    if (
        region is None
        or region[0] + region[2] > image.shape[0]
        or region[1] + region[3] > image.shape[1]
    ):
        heights, widths = np.array([image.shape[0]]), np.array([image.shape[1]])
        top, left, height, width = crop.crops(heights, widths, [boxes], draws[None])[0].tolist()
        region = (top, left, height, width)
    resize_crop(image, Box(*region), out)
    return region


def decode_iou_crops(
    buffers: Sequence[np.ndarray],
    boxes: Sequence[np.ndarray],
    crop: RandomIoUCrop,
    draws: np.ndarray,
    out: np.ndarray,
    *,
    executor: Executor | None = None,
    tasks: int = 1,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    sources: Sequence[str] | None = None,
) -> np.ndarray:
    """Decode each image's IoU crop straight into ``out``, resized to ``out``'s size.

    Args:
        buffers: ``B`` encoded images, 1-D uint8 arrays.
        boxes: ``B`` arrays ``(N_i, 4)`` xyxy in pixels of the images as displayed.
        crop: The IoU crop description.
        draws: ``(B, crop.draws_per_sample)`` uniforms in [0, 1).
        out: ``(B, H, W, C)`` uint8, C-contiguous: where the crops are written (C is 3, or
            1 for grayscale).
        executor: Optional thread pool for the per-image decodes.
        tasks: Number of slices of the batch on ``executor``.
        max_pixels: Images whose header claims more pixels are refused (``None``: no limit).
        sources: What each image is, for error messages.

    Returns:
        ``(B, 4)`` int64 crops ``(top, left, height, width)`` in the images' pixels: what
        boxes and any other field follow.

    Raises:
        fastdata.errors.DecodeError: An image that does not decode.
    """
    count = len(buffers)
    names = list(sources) if sources is not None else [f"<image {k}>" for k in range(count)]
    plans = plan_iou_crops(buffers, boxes, crop, draws, (out.shape[1], out.shape[2]))
    crops = np.zeros((count, 4), np.int64)

    def body(start: int, stop: int) -> None:
        for k in range(start, stop):
            crops[k] = decode_into_iou_crop(
                buffers[k],
                plans[k],
                boxes[k],
                crop,
                draws=draws[k],
                out=out[k],
                source=names[k],
                max_pixels=max_pixels,
            )

    parallel_for(executor, count, body, tasks=tasks)
    return crops

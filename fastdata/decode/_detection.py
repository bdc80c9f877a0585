"""Detection crops decoded in one step: a batch of encoded images cut by
:class:`fastdata.ops.RandomIoUCrop` while decoding and resized to one size, the boxes
moved from the same crops.

The IoU crop needs the image sizes and the boxes before any pixel: the sizes come from
the JPEG headers (as displayed, EXIF orientation applied; other formats are decoded first),
the boxes from the sample, so the crop is drawn first and the decoder decodes and resamples
only what it keeps (at 1/2, 1/4 or 1/8 DCT scale when the crop is at least twice the
output). The boxes go through :func:`fastdata.transforms.move_boxes` with the very crops
the pixels were cut by.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from fastdata._codec import DEFAULT_MAX_PIXELS, decode_image, jpeg_header, reduction_factors
from fastdata._threads import parallel_for
from fastdata.decode._geometry import Box
from fastdata.ops import RandomIoUCrop


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
        boxes and any other field follow (:class:`fastdata.transforms.Geometry`).

    Raises:
        fastdata.errors.DecodeError: An image that does not decode.
    """
    from fastdata.decode.cpu import decode_jpeg_box, resize_crop  # noqa: PLC0415 - a cycle

    count = len(buffers)
    names = list(sources) if sources is not None else [f"<image {k}>" for k in range(count)]
    grayscale = out.shape[3] == 1
    headers = [jpeg_header(buffer) for buffer in buffers]
    decoded: dict[int, np.ndarray] = {
        k: decode_image(buffers[k], grayscale=grayscale, source=names[k], max_pixels=max_pixels)
        for k, header in enumerate(headers)
        if header is None
    }
    sizes = np.array(
        [
            header.oriented_hw if header is not None else decoded[k].shape[:2]
            for k, header in enumerate(headers)
        ],
        np.int64,
    ).reshape(-1, 2)
    crops = crop.crops(sizes[:, 0], sizes[:, 1], boxes, draws)
    out_hw = (out.shape[1], out.shape[2])
    factors = reduction_factors(crops[:, 2:4], out_hw).tolist() if count else []
    rows = crops.tolist()

    def body(start: int, stop: int) -> None:
        for k in range(start, stop):
            box = Box(*rows[k])
            header = headers[k]
            if header is None:
                resize_crop(decoded[k], box, out[k])
                continue
            decode_jpeg_box(
                buffers[k],
                header,
                box,
                int(factors[k]),
                out[k],
                grayscale=grayscale,
                source=names[k],
                max_pixels=max_pixels,
            )

    parallel_for(executor, count, body, tasks=tasks)
    return crops

"""What a dataset's ``decode=`` means: no decoding, the full-size decode, or a
:class:`~fastdata.decode.Decoder` whose geometry (output size, crop) is decoded into.

Of a ``"cpu"`` decoder on the CPU a dataset keeps the settings, not the decoder itself: a
decoder holds threads, which neither fork nor pickle into DataLoader workers, and the
dataset decodes with its own threads (``num_threads``) and its own ``on_error``. Any other
decoder (``nvjpeg``, ``dali``, a device output) decodes whole batches in the training
process: see :mod:`fastdata.datasets._batch_decode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import cv2
import numpy as np

from fastdata import ops
from fastdata._codec import JpegHeader, decode_image, jpeg_header, reduction_factors
from fastdata._draws import UniformDraws
from fastdata._resize import resize_center_crop, resize_image
from fastdata.datasets._batch_decode import decodes_batches
from fastdata.errors import DecodeError
from fastdata.ops import RandomResizedCrop


@dataclass(frozen=True)
class CropDecode:
    """A :class:`~fastdata.decode.Decoder`'s geometry, run by a dataset on each sample.

    Attributes:
        size: Output ``(height, width)``.
        random_crop: The random resized crop, or ``None`` for the centred crop of the
            output's aspect ratio (the largest that fits), resized to ``size``.
        grayscale: One output channel instead of three.
        max_pixels: Images whose header claims more pixels are refused (``None``: no limit).
        draws: The random crops' draws, seeded as the decoder was.
    """

    size: tuple[int, int]
    random_crop: RandomResizedCrop | None
    grayscale: bool
    max_pixels: int | None
    draws: UniformDraws

    def crop_draws(self, count: int) -> np.ndarray:
        """``(count, draws_per_sample)`` uniforms for ``count`` samples' crops."""
        if self.random_crop is None:
            return np.zeros((count, 1))
        return self.draws.uniform(count, self.random_crop.draws_per_sample)

    def decode(
        self,
        data: Any,
        draws: np.ndarray,
        *,
        source: str,
        damaged: list[DecodeError] | None,
    ) -> np.ndarray:
        """One encoded image decoded into its crop: ``(H, W, C)`` uint8 (see
        :func:`fastdata.decode.cpu.decode_crop`)."""
        from fastdata.decode.cpu import decode_crop  # noqa: PLC0415 - decode imports datasets

        buffer = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        try:
            return decode_crop(
                buffer,
                self.size,
                self.random_crop,
                draws,
                grayscale=self.grayscale,
                source=source,
                max_pixels=self.max_pixels,
                damaged=damaged,
            )
        except cv2.error as error:  # OpenCV refusing these pixels, as the decoder reports it
            raise DecodeError(f"OpenCV: {str(error).strip()[-200:]}", source) from error


def resolve_decode(decode: object) -> tuple[bool, CropDecode | None]:
    """``decode=`` as (whether encoded images are decoded, the geometry of a ``"cpu"``
    decoder the dataset runs per sample, or ``None``: a bool, or a decoder run on whole
    batches, see :func:`~fastdata.datasets._batch_decode.decodes_batches`).

    Raises:
        TypeError: ``decode`` is neither a bool nor a :class:`~fastdata.decode.Decoder`.
    """
    if isinstance(decode, bool | np.bool_):
        return bool(decode), None
    from fastdata.decode import Decoder  # noqa: PLC0415 - fastdata.decode imports datasets

    if not isinstance(decode, Decoder):
        raise TypeError(
            "decode must be True, False or a fastdata.decode Decoder (from "
            f"create_decoder('cpu', ...)), got {type(decode).__name__}"
        )
    if decodes_batches(decode):  # run on whole batches in the training process
        return True, None
    seed = decode._random.seed
    return True, CropDecode(
        size=decode.size,
        random_crop=decode.random_crop,
        grayscale=decode.grayscale,
        max_pixels=decode.max_pixels,
        draws=UniformDraws(seed),
    )


class PlannedCrop(NamedTuple):
    """A JPEG's random resized crop, planned before decoding: its header, its box on the
    image as displayed (EXIF orientation applied) and the DCT scale to decode it at."""

    header: JpegHeader
    box: tuple[int, int, int, int]
    factor: int


def plan_crops(
    buffers: list[np.ndarray], crop: ops.RandomResizedCrop, draws: np.ndarray
) -> list[PlannedCrop | None]:
    """The boxes and DCT scales of a batch of encoded images, drawn in one vectorised call
    (row ``k`` of ``draws`` for image ``k``, as the transform draws them); ``None`` for an
    image that is not a JPEG with a readable header (its box is placed after decoding)."""
    headers = [jpeg_header(buffer) for buffer in buffers]
    rows = [k for k, header in enumerate(headers) if header is not None]
    plans: list[PlannedCrop | None] = [None] * len(buffers)
    if not rows:
        return plans
    sizes = np.array([headers[k].oriented_hw for k in rows], np.int64)  # type: ignore[union-attr]
    boxes = crop.boxes(sizes[:, 0], sizes[:, 1], draws[rows])
    factors = reduction_factors(boxes[:, 2:4], crop.size).tolist()
    for row, k in enumerate(rows):
        box = boxes[row].tolist()
        plans[k] = PlannedCrop(headers[k], (box[0], box[1], box[2], box[3]), factors[row])  # type: ignore[arg-type]
    return plans


def as_buffer(data: Any) -> np.ndarray:
    """Encoded bytes as a 1-D uint8 array (no copy)."""
    return data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)


def decode_into_crop(
    data: Any,
    crop: ops.RandomResizedCrop,
    draws: np.ndarray,
    *,
    source: str,
    max_pixels: int | None,
    damaged: list[DecodeError] | None,
    planned: PlannedCrop | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Decode one image straight into its random resized crop: ``(H, W, 3)`` uint8 of
    ``crop.size``, the box drawn by ``crop`` from ``draws`` on the image as displayed (EXIF
    orientation applied), as the CPU transform draws it after a full decode.

    A JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) that leaves the box at
    least the output size (its header gives the size before decoding); at full scale the
    box is resized with the transform's kernel, so the pixels are those of decoding first
    and cropping after; at a reduced scale the box is resampled with sub-pixel accuracy
    from the smaller image. ``planned`` is the JPEG's plan from :func:`plan_crops` (``None``:
    planned here, or not a JPEG); ``out`` is where to write the crop (``None``: a new array).
    """
    buffer = as_buffer(data)
    out_h, out_w = crop.size
    out = np.empty((out_h, out_w, 3), np.uint8) if out is None else out
    if planned is None:
        planned = plan_crops([buffer], crop, draws[None])[0]
    try:
        if planned is not None and planned.factor > 1:
            # here, not at the top: fastdata.decode imports fastdata.datasets
            from fastdata.decode.cpu import Box, decode_jpeg_box  # noqa: PLC0415

            decode_jpeg_box(
                buffer,
                planned.header,
                Box(*planned.box),
                planned.factor,
                out,
                grayscale=False,
                source=source,
                max_pixels=max_pixels,
                damaged=damaged,
            )
            return out
        image = decode_image(
            buffer, source=source, max_pixels=max_pixels, damaged=damaged
        )  # at full scale: a JPEG as decode_reduced(factor 1) decodes it
    except cv2.error as error:
        raise DecodeError(f"OpenCV: {str(error).strip()[-200:]}", source) from error
    if planned is None:  # not a JPEG: the box is placed on the decoded pixels
        sizes = (np.array([image.shape[0]]), np.array([image.shape[1]]))
        top, left, height, width = crop.boxes(*sizes, draws[None])[0].tolist()
    else:
        top, left, height, width = planned.box
    resize_image(image[top : top + height, left : left + width], out_w, out_h, out)
    return out


def decode_into_center(
    data: Any,
    resize: ops.Resize,
    center: ops.CenterCrop,
    out: np.ndarray,
    *,
    min_side: int | None,
    source: str,
    max_pixels: int | None,
    damaged: list[DecodeError] | None,
) -> np.ndarray:
    """Decode one image (a JPEG at the smallest DCT scale whose shorter side is still at
    least ``min_side``) and write ``center`` of its ``resize`` into ``out`` (``(H, W, 3)``
    uint8 of ``center.size``): the pixels of the ``Resize`` and ``CenterCrop`` transforms on
    the decoded image, with the resize's low-pass filter run only where the crop samples.

    Raises:
        DecodeError: The bytes are not a decodable image.
        ValueError: The resized image is smaller than the crop (as ``CenterCrop`` says).
    """
    try:
        image = decode_image(
            as_buffer(data),
            min_side=min_side,
            max_pixels=max_pixels,
            source=source,
            damaged=damaged,
        )
    except cv2.error as error:
        raise DecodeError(f"OpenCV: {str(error).strip()[-200:]}", source) from error
    if image.ndim == 2:
        image = image[:, :, None]
    resized_h, resized_w = resize.target(image.shape[0], image.shape[1])
    crop_h, crop_w = center.output_size((resized_h, resized_w)) or center.size
    box = ((resized_h - crop_h) // 2, (resized_w - crop_w) // 2, crop_h, crop_w)
    return resize_center_crop(image, (resized_h, resized_w), box, out)

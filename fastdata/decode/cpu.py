"""The ``cpu`` backend: OpenCV (libjpeg-turbo) on a thread pool, reduced-size JPEG decoding.

OpenCV releases the GIL while it decodes and resizes, so threads scale with cores. When the
crop box is at least twice the output size, the JPEG is decoded at 1/2, 1/4 or 1/8 scale
straight from its DCT coefficients, which is several times cheaper than a full decode.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import torch
from torch.utils.data import get_worker_info

from fastdata._codec import (
    DEFAULT_MAX_PIXELS,
    JpegHeader,
    decode_image,
    decode_reduced,
    jpeg_header,
    reduction_factors,
)
from fastdata._transfer import copy_to_device
from fastdata.decode._base import (
    DecodedBatch,
    Decoder,
    channels_last,
    item_source,
    resolve_num_threads,
)
from fastdata.decode._geometry import Box, crop_box, crop_boxes
from fastdata.errors import DecodeError, OnError
from fastdata.ops import Executor, RandomResizedCrop


def _interpolation(region_hw: tuple[float, float], out_hw: tuple[int, int]) -> int:
    """Area averaging when shrinking by 2x or more (it antialiases, at a cost), bilinear
    otherwise: after reduced-size decoding less than 2x is left, where bilinear is close."""
    if region_hw[0] >= 2 * out_hw[0] and region_hw[1] >= 2 * out_hw[1]:
        return cv2.INTER_AREA
    return cv2.INTER_LINEAR


def _plane(out: np.ndarray) -> np.ndarray:
    """``out`` as OpenCV writes it in place: ``(H, W)`` for one channel, else as is."""
    return out[:, :, 0] if out.shape[2] == 1 else out


def resize_crop(image: np.ndarray, box: Box, out: np.ndarray) -> None:
    """Cut ``box`` out of ``image`` (``(H, W)`` or ``(H, W, C)`` uint8) and resize it into
    ``out`` (``(H, W, C)`` uint8, C-contiguous)."""
    out_hw = (out.shape[0], out.shape[1])
    region = image[box.top : box.top + box.height, box.left : box.left + box.width]
    if region.shape[:2] == out_hw:
        out[...] = region.reshape(out.shape)
        return
    interpolation = _interpolation((box.height, box.width), out_hw)
    cv2.resize(region, (out_hw[1], out_hw[0]), dst=_plane(out), interpolation=interpolation)


def resize_scaled_crop(
    image: np.ndarray, box: Box, scale_yx: tuple[float, float], out: np.ndarray
) -> None:
    """Resample ``box`` (full-resolution pixels) from ``image``, which was decoded at
    ``scale_yx`` of full resolution, into ``out`` with sub-pixel accuracy.

    Rounding the box to whole pixels of a 1/2-1/8 scale image would shift it by up to 8
    source pixels; an affine warp keeps it exact.
    """
    out_hw = (out.shape[0], out.shape[1])
    step_y = box.height * scale_yx[0] / out_hw[0]
    step_x = box.width * scale_yx[1] / out_hw[1]
    if step_y >= 2 and step_x >= 2:  # still far larger (1/8 was not enough): average first
        resize_crop(image, _whole_pixels(box, scale_yx, image.shape[:2]), out)
        return
    # output pixel centre j + 0.5 samples the decoded image at left + (j + 0.5) * step - 0.5
    matrix = np.array(
        [
            [step_x, 0.0, box.left * scale_yx[1] + 0.5 * step_x - 0.5],
            [0.0, step_y, box.top * scale_yx[0] + 0.5 * step_y - 0.5],
        ]
    )
    cv2.warpAffine(
        image,
        matrix,
        (out_hw[1], out_hw[0]),
        dst=_plane(out),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE,
    )


def _whole_pixels(box: Box, scale_yx: tuple[float, float], image_hw: tuple[int, ...]) -> Box:
    """``box`` scaled by ``scale_yx`` and rounded to whole pixels inside ``image_hw``."""
    top, left = round(box.top * scale_yx[0]), round(box.left * scale_yx[1])
    height = max(1, min(round(box.height * scale_yx[0]), image_hw[0] - top))
    width = max(1, min(round(box.width * scale_yx[1]), image_hw[1] - left))
    return Box(top, left, height, width)


def decode_jpeg_box(
    data: np.ndarray,
    header: JpegHeader,
    box: Box,
    factor: int,
    out: np.ndarray,
    *,
    grayscale: bool,
    source: str,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    damaged: list[DecodeError] | None = None,
) -> None:
    """Decode a JPEG at ``1/factor`` scale, turned as its EXIF orientation says, and
    resample its ``box`` (full-resolution pixels of the displayed image, e.g. from
    :func:`crop_boxes` on ``header.oriented_hw``; ``factor`` from
    :func:`fastdata._codec.reduction_factors`) into ``out``.
    A JPEG whose header claims more than ``max_pixels`` pixels is refused (``None``: no
    limit); a damaged one as ``damaged`` says (see :func:`fastdata._codec.decode_image`)."""
    image = decode_reduced(
        data,
        header,
        factor,
        grayscale=grayscale,
        exif_orientation=True,
        source=source,
        max_pixels=max_pixels,
        damaged=damaged,
    )
    source_hw = header.oriented_hw
    decoded_hw = (image.shape[0], image.shape[1])
    if decoded_hw == source_hw:
        resize_crop(image, box, out)
    else:
        resize_scaled_crop(image, box, _decoded_scale(source_hw, decoded_hw, factor), out)


def _decoded_scale(
    source_hw: tuple[int, int], decoded_hw: tuple[int, int], factor: int
) -> tuple[float, float]:
    """The scale of a JPEG decoded at ``1/factor``: pixel ``i`` of the decoded image covers
    full-resolution pixels ``[factor * i, factor * (i + 1))``, the last one partly, when the
    decoder rounded the size up (``ceil(333 / 4) = 84``). ``decoded / source`` (84 / 333)
    would stretch the mapping and shift the far edge by up to a decoded pixel, ``factor``
    full-resolution pixels. Another size (a decoder that scales otherwise) maps by ratio."""
    if decoded_hw == (-(-source_hw[0] // factor), -(-source_hw[1] // factor)):
        return (1 / factor, 1 / factor)
    return (decoded_hw[0] / source_hw[0], decoded_hw[1] / source_hw[1])


def decode_crop(
    data: np.ndarray,
    out_hw: tuple[int, int],
    crop: RandomResizedCrop | None,
    draws: np.ndarray,
    *,
    grayscale: bool = False,
    source: str = "<bytes>",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    damaged: list[DecodeError] | None = None,
) -> np.ndarray:
    """Decode one image, cut its crop box and resize it to ``out_hw``.

    A JPEG's EXIF orientation is applied before the crop box is placed, the rule of
    preprocessing and ``RAMDataset`` (see :mod:`fastdata._codec`): the box is drawn on the
    image as displayed. An image whose header claims more than ``max_pixels`` pixels is
    refused before decoding (``None``: no limit); a damaged JPEG as ``damaged`` says (see
    :func:`fastdata._codec.decode_image`).

    Returns:
        ``(H, W, C)`` uint8 RGB (C = 1 when ``grayscale``).

    Raises:
        DecodeError: The bytes are not a decodable image.
    """
    out = np.empty((*out_hw, 1 if grayscale else 3), dtype=np.uint8)
    header = jpeg_header(data)
    if header is None:  # not a JPEG: decode first, then place the box on real pixels
        image = decode_image(
            data, grayscale=grayscale, source=source, max_pixels=max_pixels, damaged=damaged
        )
        resize_crop(image, crop_box(image.shape[:2], out_hw, crop, draws), out)
        return out
    box = crop_box(header.oriented_hw, out_hw, crop, draws)
    factor = int(reduction_factors(np.array([[box.height, box.width]]), out_hw)[0])
    decode_jpeg_box(
        data,
        header,
        box,
        factor,
        out,
        grayscale=grayscale,
        source=source,
        max_pixels=max_pixels,
        damaged=damaged,
    )
    return out


def _batch_buffer(shape: tuple[int, ...], *, pinned: bool) -> torch.Tensor:
    """The uint8 output batch. Inside a DataLoader worker it is allocated in shared memory,
    so sending it to the main process copies nothing more; in the training process it is
    pinned when ``pinned`` (a CUDA target), so its copy to the device need not block the
    host (see :func:`fastdata._transfer.copy_to_device`)."""
    if get_worker_info() is None:
        return _empty_batch(shape, pinned=pinned)
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape, dtype=np.int64)))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def _empty_batch(shape: tuple[int, ...], *, pinned: bool) -> torch.Tensor:
    # From torch's caching host allocator when pinned: reused across batches, and kept
    # from reuse until the copy reading it is done.
    return torch.empty(shape, dtype=torch.uint8, pin_memory=pinned)


class CpuDecoder(Decoder):
    """Decode on CPU threads with OpenCV; see :func:`fastdata.decode.create_decoder`.

    Args:
        size: Output ``(height, width)``, or an int for a square.
        random_crop: The random resized crop to run (training; see :class:`Decoder`), or
            ``None`` for a centred crop.
        device: Where the output batch goes (copied there after decoding on the CPU; for a
            CUDA device the batch is decoded into pinned memory and copied without blocking
            the host, ordered on the current stream).
        on_error: As for :class:`~fastdata.decode.Decoder` (see
            :class:`~fastdata.errors.OnError`).
        grayscale: Decode to one channel.
        num_threads: Decoding threads (default: the CPUs this process may use).
        seed: Seed of the random crops.
        max_pixels: Refuse (as a :class:`~fastdata.DecodeError`, handled by ``on_error``)
            an image whose header claims more pixels (width x height) than this, before
            decoding it; ``0`` or ``None``: no limit. Default: PIL's limit, 89,478,485.

    Raises:
        ValueError: ``max_pixels`` is negative or not an int.
    """

    backend = "cpu"
    checks_max_pixels = True  # from the header its plan reads; refusals join last_errors

    def __init__(
        self,
        size: int | tuple[int, int],
        *,
        random_crop: RandomResizedCrop | Executor | bool | None = None,
        device: torch.device | str = "cpu",
        on_error: OnError | str = "raise",
        grayscale: bool = False,
        num_threads: int | None = None,
        seed: int | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        super().__init__(
            size,
            random_crop=random_crop,
            device=torch.device(device),
            on_error=on_error,
            grayscale=grayscale,
            seed=seed,
            max_pixels=max_pixels,
        )
        self.num_threads = resolve_num_threads(num_threads)
        # The decode errors of the last batch, whatever on_error did with them (a damaged
        # JPEG that was kept is among them, with ``kept`` true).
        self.last_errors: list[DecodeError] = []
        # Keep a damaged JPEG that decodes ("warn"; see fastdata._turbojpeg).
        self.keep_damaged = self.on_error is OnError.WARN
        self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="fastdata-decode")
        self._pinned = self.device.type == "cuda"

    def _decode(self, buffers: list[np.ndarray]) -> DecodedBatch:
        count = len(buffers)
        draws = self._draws(buffers)
        batch = _batch_buffer((count, *self.size, self.channels), pinned=self._pinned)
        out = batch.numpy()
        # The geometry of the whole batch first, vectorised in this thread, so that the
        # decoding threads run little Python between the calls that release the GIL.
        headers = [jpeg_header(data) for data in buffers]
        jpegs = [i for i, header in enumerate(headers) if header is not None]
        # crop boxes are drawn on the image as displayed (EXIF orientation applied)
        sizes = [headers[i].oriented_hw for i in jpegs]  # type: ignore[union-attr]
        boxes = crop_boxes(sizes, self.size, self.random_crop, draws[jpegs])
        factors = reduction_factors(boxes[:, 2:4], self.size)
        plan: list[tuple[Box, int] | None] = [None] * count
        for row, index in enumerate(jpegs):
            plan[index] = (Box(*boxes[row].tolist()), int(factors[row]))
        errors: list[DecodeError | None] = [None] * count
        damaged: list[list[DecodeError] | None] = [
            [] if self.keep_damaged else None for _ in range(count)
        ]

        def work(first: int) -> None:
            for index in range(first, count, self.num_threads):
                source = item_source(buffers, index)
                try:
                    planned, header = plan[index], headers[index]
                    if planned is None or header is None:  # not a JPEG
                        out[index] = decode_crop(
                            buffers[index],
                            self.size,
                            self.random_crop,
                            draws[index],
                            grayscale=self.grayscale,
                            source=source,
                            max_pixels=self.max_pixels,
                            damaged=damaged[index],
                        )
                    else:
                        box, factor = planned
                        decode_jpeg_box(
                            buffers[index],
                            header,
                            box,
                            factor,
                            out[index],
                            grayscale=self.grayscale,
                            source=source,
                            max_pixels=self.max_pixels,
                            damaged=damaged[index],
                        )
                except DecodeError as error:
                    errors[index] = error
                except cv2.error as error:  # OpenCV refusing these pixels (a decoder error)
                    errors[index] = DecodeError(f"OpenCV: {str(error).strip()[-200:]}", source)

        if self.num_threads == 1 or count < 2:
            work(0)  # every index when one thread; the only one when count < 2
        else:
            list(self._pool.map(work, range(self.num_threads)))
        kept = [i for i, error in enumerate(errors) if error is None]
        self.last_errors = []  # in batch order; a damaged JPEG that was kept says so
        for error, notes in zip(errors, damaged, strict=True):
            self.last_errors.extend([error] if error is not None else notes or [])
        for error in self.last_errors:
            self.on_error.handle(error, stacklevel=2)
        pixels = batch if len(kept) == count else torch.from_numpy(out[kept])
        # to the device without blocking the host (a pageable copy would wait for all work
        # queued on the current stream)
        images = copy_to_device(channels_last(pixels), self.device)
        return DecodedBatch(images, torch.tensor(kept, dtype=torch.int64))

    def close(self) -> None:
        """Stop the decoding threads."""
        self._pool.shutdown(wait=True)

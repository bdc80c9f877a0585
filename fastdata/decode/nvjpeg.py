"""The ``nvjpeg`` backend: batched nvJPEG through ``torchvision.io.decode_jpeg`` on a CUDA
device, then crop and resize on the device.

Streams: decoding and resizing run on a side stream of the decoder's own, which never
waits for the caller's stream (the inputs are host bytes), so decoding overlaps the
caller's queued work. An event is recorded on the side stream after each batch; the
caller's current stream waits for it and the output is ``record_stream``-ed on the
caller's stream, so the batch can be used right away on that stream. torchvision decodes
on a private stream that does not wait for the current one (pytorch/vision#9606): the
memory it is handed must not be read by queued work, so before each decode the host
waits for the previous batch's event (only this decoder's own work, never the caller's).
The side stream is a high-priority one, from a pool apart from the one torchvision takes
its private stream from. No step syncs the host with the caller's stream: crop indices
go to the device as tensors copied from pinned memory, never as Python lists.

Look-ahead: :meth:`NvJpegDecoder.decode_stream` (what :class:`DecodingLoader` uses) decodes
batch ``i + 1`` on a background thread while the caller works on batch ``i``.

One device per process: torchvision keeps one global nvJPEG decoder and rebuilds it when
the device changes, so decoders on two GPUs in one process rebuild it on every switch
(one process per GPU, as under DDP, never does).

Errors: a batched ``decode_jpeg`` returns nothing when any image is bad, so a failed batch
is retried image by image; images nvJPEG cannot decode (non-JPEG bytes, CMYK, failures) go
through the CPU decoder, and only what neither can decode is handled by ``on_error``.
Environment errors (CUDA out of memory, a torchvision built without nvJPEG) are raised,
never turned into CPU decoding; torchvision reports nvJPEG statuses as numbers ("Failed to
decode batch: 5" is an allocation failure), which are told apart by number. Fallbacks are
counted in ``decoder.fallbacks`` and warned about when a count reaches 1, 10, 100, ...

EXIF orientation: a JPEG's orientation tag is applied, the rule of the other backends
(torchvision's ``apply_exif_orientation`` works on the CPU only, so it is done here). Crop
boxes are drawn on the image as displayed; each box is mapped back to the stored pixels
nvJPEG returns (:func:`stored_box`), and only that region is flipped or transposed
(:func:`orient_chw`) before resizing, so a rotated photo costs a copy of its crop, not of
the whole image.

Truncated JPEGs: nvJPEG may decode a truncated file without an error, the missing rows
left grey or black, where the ``cpu`` backend raises a :class:`~fastdata.DecodeError`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from typing import Any, NamedTuple

import numpy as np
import torch

from fastdata._codec import DEFAULT_MAX_PIXELS, JpegHeader, jpeg_header
from fastdata._optional import DISTRIBUTION, import_optional
from fastdata._transfer import copy_to_device
from fastdata.decode._base import (
    DecodedBatch,
    Decoder,
    item_source,
)
from fastdata.decode._batching import crop_resize_batch, decode_batch_or_each
from fastdata.decode._geometry import Box, crop_box
from fastdata.decode.cpu import decode_crop
from fastdata.errors import DecodeError, FastDataError, OnError
from fastdata.gpu.prefetch import resolve_device
from fastdata.ops import Executor, RandomResizedCrop

# Component counts nvJPEG decodes to the right colours (gray, YCbCr); CMYK goes to the CPU.
_NVJPEG_COMPONENTS = (1, 3)
# decode_jpeg takes a list of images (one batched nvJPEG call) from torchvision 0.20 on.
MIN_TORCHVISION = (0, 20)


def torchvision_version() -> str | None:
    """The installed torchvision's version string (read from its metadata, no import)."""
    try:
        return metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        return None


def torchvision_too_old(version: str) -> bool:
    """Whether ``version`` predates batched ``decode_jpeg`` (0.20)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and (int(match[1]), int(match[2])) < MIN_TORCHVISION


def check_torchvision() -> None:
    """Raise when the installed torchvision cannot decode batches on the GPU.

    Raises:
        ModuleNotFoundError: torchvision is missing (the message gives the pip command).
        FastDataError: torchvision is older than 0.20.
    """
    version = torchvision_version()
    if version is None:
        import_optional("torchvision.io", "The nvjpeg decoder backend")
        return
    if torchvision_too_old(version):
        raise FastDataError(
            f"the nvjpeg decoder backend needs torchvision >= 0.20 (batched decode_jpeg), "
            f"found torchvision {version}: pip install 'torchvision>=0.20' (or "
            f"pip install '{DISTRIBUTION}[gpu]'), or use backend='cpu'"
        )


def load_decode_jpeg(grayscale: bool) -> Callable[..., Any]:
    """``torchvision.io.decode_jpeg`` bound to the RGB or GRAY read mode.

    Raises:
        ModuleNotFoundError: torchvision is missing.
        FastDataError: torchvision is older than 0.20.
    """
    check_torchvision()
    tv_io = import_optional("torchvision.io", "The nvjpeg decoder backend")
    mode = tv_io.ImageReadMode.GRAY if grayscale else tv_io.ImageReadMode.RGB
    decode_jpeg = tv_io.decode_jpeg

    def decode(data: torch.Tensor | list[torch.Tensor], device: torch.device) -> Any:
        return decode_jpeg(data, mode=mode, device=device)

    return decode


# EXIF orientations whose displayed image reads the stored rows / columns backwards
# (see fastdata._codec.orient).
_FLIPS_ROWS = (3, 4, 6, 7)
_FLIPS_COLUMNS = (2, 3, 7, 8)
# The dimensions orient_chw flips, after transposing the last two for 5-8.
_ORIENT_FLIPS = {2: (-1,), 3: (-2, -1), 4: (-2,), 6: (-1,), 7: (-2, -1), 8: (-2,)}


def orient_chw(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """Apply an EXIF orientation (1-8) to ``(C, H, W)`` pixels on any device: the flip or
    rotation that shows them as displayed (:func:`fastdata._codec.orient` for tensors).

    Args:
        image: ``(C, H, W)`` pixels as stored, on any device.
        orientation: The EXIF orientation tag (1-8; other values leave ``image`` as is).

    Returns:
        ``(C, H, W)`` (``(C, W, H)`` for 5-8); ``image`` itself for 1, a view for 5.
    """
    if orientation >= 5:
        image = image.transpose(-2, -1)
    dims = _ORIENT_FLIPS.get(orientation, ())
    return image.flip(dims) if dims else image


def stored_box(box: Box, orientation: int, stored_hw: tuple[int, int]) -> Box:
    """The box of the stored pixels that ``box`` (drawn on the image as displayed, with EXIF
    ``orientation`` 1-8 applied) covers: ``orient_chw(stored[stored_box], orientation)``
    equals ``orient_chw(stored, orientation)[box]``.

    Args:
        box: ``(top, left, height, width)`` on the displayed image.
        orientation: The EXIF orientation tag (1-8; 1 returns ``box``).
        stored_hw: ``(height, width)`` of the image as stored (as decoded by nvJPEG).
    """
    top, left, height, width = box
    if orientation >= 5:  # displayed rows are stored columns
        top, left, height, width = left, top, width, height
    if orientation in _FLIPS_ROWS:
        top = stored_hw[0] - top - height
    if orientation in _FLIPS_COLUMNS:
        left = stored_hw[1] - left - width
    return Box(top, left, height, width)


def oriented_region(image: torch.Tensor, box: Box, orientation: int) -> torch.Tensor:
    """``box`` (displayed coordinates) cut out of a ``(C, H, W)`` image decoded as stored
    and shown as displayed: ``(C, box.height, box.width)`` on the image's device (at most
    the region is copied, never the whole image).

    Args:
        image: ``(C, H, W)`` pixels as stored.
        box: ``(top, left, height, width)`` on the displayed image.
        orientation: The EXIF orientation tag (1-8).
    """
    top, left, height, width = stored_box(box, orientation, (image.shape[-2], image.shape[-1]))
    return orient_chw(image[:, top : top + height, left : left + width], orientation)


def _like(tensor: torch.Tensor) -> dict[str, Any]:
    return {"dtype": tensor.dtype, "device": tensor.device}


class _Plan(NamedTuple):
    """One batch, checked and with its crop draws taken (in the caller's thread, in order)."""

    buffers: list[np.ndarray]
    draws: np.ndarray
    headers: list[JpegHeader | None]


class NvJpegDecoder(Decoder):
    """Decode JPEGs with nvJPEG on a CUDA device; see :func:`fastdata.decode.create_decoder`.

    Args:
        size: Output ``(height, width)``, or an int for a square.
        random_crop: The random resized crop to run (training; see :class:`Decoder`), or
            ``None`` for a centred crop.
        device: The CUDA device that decodes and holds the output: ``"cuda:1"``, an int
            (``local_rank`` under DDP), or ``"cuda"`` for the current device when the
            decoder is built (``cuda:LOCAL_RANK`` under ``torchrun``, see
            :func:`fastdata.gpu.prefetch.resolve_device`).
        on_error: As for :class:`~fastdata.decode.Decoder` (see
            :class:`~fastdata.errors.OnError`).
        grayscale: Decode to one channel.
        seed: Seed of the random crops.
        max_pixels: As for :class:`~fastdata.decode.Decoder`.
    """

    backend = "nvjpeg"

    def __init__(
        self,
        size: int | tuple[int, int],
        *,
        random_crop: RandomResizedCrop | Executor | bool | None = None,
        device: torch.device | str | int = "cuda",
        on_error: OnError | str = "raise",
        grayscale: bool = False,
        seed: int | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        super().__init__(
            size,
            random_crop=random_crop,
            device=resolve_device(device),
            on_error=on_error,
            grayscale=grayscale,
            seed=seed,
            max_pixels=max_pixels,
        )
        self._decode_jpeg = load_decode_jpeg(self.grayscale)
        # A high-priority stream: those come from a pool apart from the normal-priority
        # one torchvision takes its private nvJPEG stream from, so the two never alias.
        self._stream = (
            torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
        )
        # Recorded on the side stream after the last batch's work (see the module docstring).
        self._done: Any = None
        # One batch at a time on the side stream (decode_stream decodes on a thread).
        self._lock = threading.Lock()

    def _fallback(self, data: np.ndarray, draws: np.ndarray, source: str) -> torch.Tensor:
        """Decode one image (``source``, for errors) on the CPU, with the same geometry, and
        upload it."""
        pixels = decode_crop(
            data,
            self.size,
            self.random_crop,
            draws,
            grayscale=self.grayscale,
            source=source,
            max_pixels=self.max_pixels,
        )
        return copy_to_device(torch.from_numpy(pixels).permute(2, 0, 1), self.device)

    def _on_batch_failure(self, error: Exception) -> None:
        self.count_fallback(
            "batch_retry",
            f"a batch failed in nvJPEG ({error}); it is decoded image by image, and images "
            "nvJPEG cannot decode go to the CPU decoder (much slower)",
        )

    def _plan(self, buffers: list[np.ndarray]) -> _Plan:
        draws = self._draws(buffers)
        return _Plan(buffers, draws, [jpeg_header(buf) for buf in buffers])

    def _decode(self, buffers: list[np.ndarray]) -> DecodedBatch:
        return self._hand_out(*self._decode_planned(self._plan(buffers)))

    def _decode_stream(self, batches: Iterable[list[np.ndarray]]) -> Iterator[DecodedBatch]:
        """Decode ``batches`` in order, batch ``i + 1`` on a background thread (on the
        decoder's side stream) while the caller works on batch ``i``; the same results as
        :meth:`decode` per batch. Crop draws are taken here, in order, so a seed gives the
        crops :meth:`decode` gives."""
        worker = ThreadPoolExecutor(1, thread_name_prefix="fastdata-nvjpeg")
        pending: Future[tuple[DecodedBatch, Any]] | None = None
        try:
            for buffers in batches:
                previous = pending
                pending = worker.submit(self._decode_planned, self._plan(buffers))
                if previous is not None:
                    yield self._hand_out(*previous.result())
            if pending is not None:
                last, pending = pending, None
                yield self._hand_out(*last.result())
        finally:
            if pending is not None:  # left early: the batch in flight is not handed out
                pending.cancel()
                with contextlib.suppress(Exception):
                    pending.result()
            worker.shutdown(wait=True)

    def _hand_out(self, decoded: DecodedBatch, done: Any) -> DecodedBatch:
        """Make the calling thread's current stream wait for ``done`` (the side stream's
        event after the batch) and keep the batch's memory from reuse until that stream's
        queued work is done."""
        if done is not None:
            caller = torch.cuda.current_stream(self.device)
            caller.wait_event(done)
            decoded.images.record_stream(caller)
        return decoded

    def _decode_planned(self, plan: _Plan) -> tuple[DecodedBatch, Any]:
        """Decode a planned batch on the side stream: the batch and the event recorded
        after its work (``None`` without streams), for :meth:`_hand_out`."""
        with self._lock:
            if self._stream is None:
                return self._decode_on_current_stream(plan), None
            if self._done is not None:
                # nvJPEG's private stream may be handed memory our last batch's queued
                # kernels still read: wait for that work (ours only), not the caller's.
                self._done.synchronize()
            try:
                # the stream's context also makes its device current (in this thread)
                with torch.cuda.stream(self._stream):
                    decoded = self._decode_on_current_stream(plan)
            finally:
                # also after a failure: work of this batch may be queued on the side stream
                done = torch.cuda.Event()
                done.record(self._stream)
                self._done = done
            return decoded, done

    def _decode_on_current_stream(self, plan: _Plan) -> DecodedBatch:
        buffers, draws, headers = plan
        on_gpu = [i for i, h in enumerate(headers) if h is not None and h[2] in _NVJPEG_COMPONENTS]
        if len(on_gpu) < len(buffers):
            self.count_fallback(
                "cpu_decode",
                f"{len(buffers) - len(on_gpu)} of {len(buffers)} images in a batch are not "
                "1- or 3-component JPEGs (PNG, CMYK, ...) and go to the CPU decoder",
                len(buffers) - len(on_gpu),
            )
        # decode_jpeg wants CPU uint8 tensors; bytes arrive read-only, which torch refuses.
        tensors = [
            torch.from_numpy(buffers[i] if buffers[i].flags.writeable else buffers[i].copy())
            for i in on_gpu
        ]
        results = decode_batch_or_each(
            tensors,
            lambda batch: self._decode_jpeg(batch, self.device),
            lambda one: self._decode_jpeg(one, self.device),
            on_batch_failure=self._on_batch_failure,
        )
        decoded: dict[int, torch.Tensor | Exception] = dict(zip(on_gpu, results, strict=True))
        on_device: list[torch.Tensor] = []
        boxes: list[Box] = []
        fallen: dict[int, torch.Tensor] = {}
        kept: list[int] = []
        for index, data in enumerate(buffers):
            result = decoded.get(index)
            try:
                if isinstance(result, torch.Tensor):
                    # nvJPEG returns the stored pixels: the box is drawn on the displayed
                    # image and only its region is turned upright
                    orientation = headers[index].orientation  # type: ignore[union-attr]
                    source_hw = (int(result.shape[-2]), int(result.shape[-1]))
                    if orientation >= 5:
                        source_hw = (source_hw[1], source_hw[0])
                    box = crop_box(source_hw, self.size, self.random_crop, draws[index])
                    if orientation != 1:
                        result = oriented_region(result, box, orientation)
                        box = Box(0, 0, box.height, box.width)
                    boxes.append(box)
                    on_device.append(result)
                else:
                    if index in decoded:
                        self.count_fallback(
                            "cpu_decode",
                            f"nvJPEG could not decode {item_source(buffers, index)} ({result}); "
                            "it goes to the CPU decoder",
                        )
                    fallen[len(kept)] = self._fallback(
                        data, draws[index], item_source(buffers, index)
                    )
            except DecodeError as error:
                self.on_error.handle(error, stacklevel=4)
                continue
            kept.append(index)
        batch = torch.empty(
            (len(kept), self.channels, *self.size),
            dtype=torch.uint8,
            device=self.device,
            memory_format=torch.channels_last,
        )
        if fallen:
            gpu_rows = [row for row in range(len(kept)) if row not in fallen]
            resized = torch.empty((len(gpu_rows), *batch.shape[1:]), **_like(batch))
            crop_resize_batch(on_device, boxes, resized)
            # a device index: a Python list as an index would sync the host (see
            # crop_resize_batch)
            rows_index = copy_to_device(torch.tensor(gpu_rows, dtype=torch.int64), self.device)
            batch.index_copy_(0, rows_index, resized)
            for row, image in fallen.items():
                batch[row] = image
        else:
            crop_resize_batch(on_device, boxes, batch)
        return DecodedBatch(batch, torch.tensor(kept, dtype=torch.int64))

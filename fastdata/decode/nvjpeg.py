"""The ``nvjpeg`` backend: batched nvJPEG through ``torchvision.io.decode_jpeg`` on a CUDA
device, then crop and resize on the device.

Streams: decoding and resizing run on a side stream of the decoder's own; the caller's
current stream is made to wait for it and the output is recorded on the caller's stream, so
the batch can be used right away on that stream. torchvision decodes on a private stream
that does not wait for the current one (pytorch/vision#9606), so the side stream is
synchronized before each decode: the memory nvJPEG writes into is then idle.

Errors: a batched ``decode_jpeg`` returns nothing when any image is bad, so a failed batch
is retried image by image; images nvJPEG cannot decode (non-JPEG bytes, CMYK, failures) go
through the CPU decoder, and only what neither can decode is handled by ``on_error``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fastdata._codec import jpeg_header
from fastdata._optional import import_optional
from fastdata.decode._base import (
    DecodedBatch,
    Decoder,
    EncodedImage,
    apply_on_error,
    check_batch,
)
from fastdata.decode._batching import crop_resize_chw, decode_batch_or_each
from fastdata.decode._geometry import RandomResizedCrop, crop_box
from fastdata.decode.cpu import decode_crop
from fastdata.errors import DecodeError

# Component counts nvJPEG decodes to the right colours (gray, YCbCr); CMYK goes to the CPU.
_NVJPEG_COMPONENTS = (1, 3)


def load_decode_jpeg(grayscale: bool) -> Callable[..., Any]:
    """``torchvision.io.decode_jpeg`` bound to the RGB or GRAY read mode."""
    tv_io = import_optional("torchvision.io", "The nvjpeg decoder backend")
    mode = tv_io.ImageReadMode.GRAY if grayscale else tv_io.ImageReadMode.RGB
    decode_jpeg = tv_io.decode_jpeg

    def decode(data: torch.Tensor | list[torch.Tensor], device: torch.device) -> Any:
        return decode_jpeg(data, mode=mode, device=device)

    return decode


class NvJpegDecoder(Decoder):
    """Decode JPEGs with nvJPEG on a CUDA device; see :func:`fastdata.decode.create_decoder`.

    Args:
        size: Output ``(height, width)``, or an int for a square.
        random_crop: Random resized crop parameters (training), or ``None`` for a centred crop.
        device: The CUDA device that decodes and holds the output.
        on_error: ``"raise"``, ``"skip"`` or ``"warn"``.
        grayscale: Decode to one channel.
        seed: Seed of the random crops.
    """

    backend = "nvjpeg"

    def __init__(
        self,
        size: int | tuple[int, int],
        *,
        random_crop: RandomResizedCrop | bool | None = None,
        device: torch.device | str = "cuda",
        on_error: str = "raise",
        grayscale: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            size,
            random_crop=random_crop,
            device=torch.device(device),
            on_error=on_error,
            grayscale=grayscale,
            seed=seed,
        )
        self._decode_jpeg = load_decode_jpeg(self.grayscale)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _fallback(self, data: np.ndarray, draws: np.ndarray, index: int) -> torch.Tensor:
        """Decode one image on the CPU, with the same geometry, and upload it."""
        pixels = decode_crop(
            data,
            self.size,
            self.random_crop,
            draws,
            grayscale=self.grayscale,
            source=f"batch item {index}",
        )
        return torch.from_numpy(pixels).permute(2, 0, 1).to(self.device)

    def decode(self, encoded: Sequence[EncodedImage]) -> DecodedBatch:
        buffers = check_batch(encoded)
        draws = self._draws(len(buffers))
        headers = [jpeg_header(buf) for buf in buffers]
        on_gpu = [i for i, h in enumerate(headers) if h is not None and h[2] in _NVJPEG_COMPONENTS]
        # decode_jpeg wants CPU uint8 tensors; bytes arrive read-only, which torch refuses.
        tensors = [
            torch.from_numpy(buffers[i] if buffers[i].flags.writeable else buffers[i].copy())
            for i in on_gpu
        ]
        caller = torch.cuda.current_stream(self.device) if self._stream is not None else None
        context = torch.cuda.stream(self._stream) if self._stream is not None else None
        with context or contextlib.nullcontext():
            if self._stream is not None and caller is not None:
                self._stream.wait_stream(caller)
                self._stream.synchronize()
            results = decode_batch_or_each(
                tensors,
                lambda batch: self._decode_jpeg(batch, self.device),
                lambda one: self._decode_jpeg(one, self.device),
            )
            decoded: dict[int, torch.Tensor | Exception] = dict(zip(on_gpu, results, strict=True))
            images: list[torch.Tensor] = []
            kept: list[int] = []
            for index, data in enumerate(buffers):
                result = decoded.get(index)
                try:
                    if isinstance(result, torch.Tensor):
                        source_hw = (int(result.shape[-2]), int(result.shape[-1]))
                        box = crop_box(source_hw, self.size, self.random_crop, draws[index])
                        images.append(crop_resize_chw(result, box, self.size))
                    else:
                        images.append(self._fallback(data, draws[index], index))
                except DecodeError as error:
                    apply_on_error(self.on_error, error)
                    continue
                kept.append(index)
            batch = torch.empty(
                (len(images), self.channels, *self.size),
                dtype=torch.uint8,
                device=self.device,
                memory_format=torch.channels_last,
            )
            for row, image in enumerate(images):
                batch[row] = image
        if self._stream is not None and caller is not None:
            caller.wait_stream(self._stream)
            batch.record_stream(caller)
        return DecodedBatch(batch, torch.tensor(kept, dtype=torch.int64))

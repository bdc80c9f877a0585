"""What a dataset's ``decode=`` means: no decoding, the full-size decode, or a
:class:`~fastdata.decode.Decoder` whose geometry (output size, crop) is decoded into.

A dataset keeps the decoder's settings, not the decoder itself: a decoder holds threads,
which neither fork nor pickle into DataLoader workers, and the dataset decodes with its
own threads (``num_threads``) and its own ``on_error``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from fastdata._draws import UniformDraws
from fastdata.errors import DecodeError
from fastdata.ops import RandomResizedCrop

# The decoder backends a dataset can decode with in its own threads and worker processes.
DATASET_BACKENDS = ("cpu",)


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
    """``decode=`` as (whether encoded images are decoded, the decoder geometry or ``None``).

    Raises:
        TypeError: ``decode`` is neither a bool nor a :class:`~fastdata.decode.Decoder`.
        ValueError: ``decode`` is a decoder of a backend a dataset cannot run, or one that
            sends its output to a device.
    """
    if isinstance(decode, bool | np.bool_):
        return bool(decode), None
    from fastdata.decode import Decoder  # noqa: PLC0415 - fastdata.decode imports datasets

    if not isinstance(decode, Decoder):
        raise TypeError(
            "decode must be True, False or a fastdata.decode Decoder (from "
            f"create_decoder('cpu', ...)), got {type(decode).__name__}"
        )
    if decode.backend not in DATASET_BACKENDS or decode.device.type != "cpu":
        raise ValueError(
            f"decode={decode!r}: a dataset decodes with a 'cpu' decoder on device 'cpu' "
            f"only (backend {decode.backend!r}, device {str(decode.device)!r} given); decode "
            "on the GPU with fastdata.decode.DecodingLoader over decode=False batches"
        )
    seed = decode._random.seed
    return True, CropDecode(
        size=decode.size,
        random_crop=decode.random_crop,
        grayscale=decode.grayscale,
        max_pixels=decode.max_pixels,
        draws=UniformDraws(seed),
    )

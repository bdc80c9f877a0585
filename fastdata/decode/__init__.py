"""Batch image decoding behind one interface: ``cpu`` (OpenCV threads), ``nvjpeg``
(torchvision on CUDA) and ``dali`` (NVIDIA DALI), plus :class:`DecodingLoader` to decode
DataLoader batches of encoded bytes in the main process. Another backend is a
:class:`Decoder` subclass made known by :func:`register_decoder`.

Backends import their optional packages (torchvision, DALI) only when created. A decoder's
``random_crop`` is the one description of that crop, :class:`fastdata.ops.RandomResizedCrop`.
"""

from fastdata.decode._base import DecodedBatch, Decoder, DecoderRecipe
from fastdata.decode.factory import create_decoder, register_decoder
from fastdata.decode.loader import DecodingLoader

__all__ = [
    "DecodedBatch",
    "Decoder",
    "DecoderRecipe",
    "DecodingLoader",
    "create_decoder",
    "register_decoder",
]

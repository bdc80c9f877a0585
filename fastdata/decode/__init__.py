"""Batch image decoding behind one interface: ``cpu`` (OpenCV threads), ``nvjpeg``
(torchvision on CUDA) and ``dali`` (NVIDIA DALI), plus :class:`DecodingLoader` to decode
DataLoader batches of encoded bytes in the main process.

Backends import their optional packages (torchvision, DALI) only when created. A decoder's
``random_crop`` is the one description of that crop, :class:`fastdata.ops.RandomResizedCrop`.
"""

from fastdata.decode._base import ON_ERROR, DecodedBatch, Decoder
from fastdata.decode.factory import BACKENDS, create_decoder, resolve_backend
from fastdata.decode.loader import LAST_BATCH, DecodingLoader

__all__ = [
    "BACKENDS",
    "LAST_BATCH",
    "ON_ERROR",
    "DecodedBatch",
    "Decoder",
    "DecodingLoader",
    "create_decoder",
    "resolve_backend",
]

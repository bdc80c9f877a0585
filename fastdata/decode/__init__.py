"""Batch image decoding behind one interface: ``cpu`` (OpenCV threads), ``nvjpeg``
(torchvision on CUDA) and ``dali`` (NVIDIA DALI), plus :class:`DecodingLoader` to decode
DataLoader batches of encoded bytes in the main process.

Backends import their optional packages (torchvision, DALI) only when created.
"""

from fastdata.decode._base import DecodedBatch, Decoder
from fastdata.decode._geometry import RandomResizedCrop
from fastdata.decode.factory import BACKENDS, create_decoder, resolve_backend
from fastdata.decode.loader import LAST_BATCH, DecodingLoader

__all__ = [
    "BACKENDS",
    "LAST_BATCH",
    "DecodedBatch",
    "Decoder",
    "DecodingLoader",
    "RandomResizedCrop",
    "create_decoder",
    "resolve_backend",
]

"""Per-batch CPU uint8 augmentations (OpenCV): crops, resizes, flips.

They take a whole batch (``(B, C, H, W)`` uint8 tensor, ``(B, H, W, C)`` uint8 array, or
a list of ``(H, W, C)`` uint8 arrays), are seeded per DataLoader worker, and compose with
:class:`~fastdata.datasets.ShardDataset` and :class:`~fastdata.datasets.RAMDataset`,
which call them once per batch on their thread pool. Any other callable (a torchvision
transform) given to a dataset is applied per sample instead.
"""

from fastdata.transforms._base import BatchTransform, Compose
from fastdata.transforms._geometric import (
    CenterCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

__all__ = [
    "BatchTransform",
    "CenterCrop",
    "Compose",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
]

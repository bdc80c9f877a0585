"""Per-batch CPU uint8 augmentations (NumPy and OpenCV): crops, resizes, flips, colour,
affine, erasing, the RandAugment, TrivialAugmentWide and AugMix policies, and MixUp/CutMix for
collated batches.

They take a whole batch (``(B, C, H, W)`` uint8 tensor, ``(B, H, W, C)`` uint8 array, or
a list of ``(H, W, C)`` uint8 arrays), are seeded per DataLoader worker, and compose with
:class:`~fastdata.datasets.ShardDataset` and :class:`~fastdata.datasets.RAMDataset`,
which call them once per batch on their thread pool, every field moved by its role
(images, masks nearest-neighbour, detection boxes with their labels; see
:class:`FieldBatch`). Any other callable (a torchvision transform) given to a dataset is
applied per sample to the image instead.
"""

from fastdata._fields import FieldBatch, Geometry, Move, register_mover
from fastdata.transforms._augmix import AugMix
from fastdata.transforms._base import BatchTransform, Compose
from fastdata.transforms._detection import Letterbox, RandomIoUCrop
from fastdata.transforms._geometric import (
    CenterCrop,
    GeometricTransform,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from fastdata.transforms._mix import CutMix, MixUp, RandomChoice
from fastdata.transforms._steps import (
    ColorJitter,
    GaussianBlur,
    RandAugment,
    RandomAdjustSharpness,
    RandomAffine,
    RandomAutocontrast,
    RandomEqualize,
    RandomErasing,
    RandomGrayscale,
    RandomInvert,
    RandomPosterize,
    RandomSolarize,
    StepTransform,
    TrivialAugmentWide,
)

__all__ = [
    "AugMix",
    "BatchTransform",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "FieldBatch",
    "GaussianBlur",
    "GeometricTransform",
    "Geometry",
    "Letterbox",
    "MixUp",
    "Move",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomIoUCrop",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomSolarize",
    "Resize",
    "StepTransform",
    "TrivialAugmentWide",
    "register_mover",
]

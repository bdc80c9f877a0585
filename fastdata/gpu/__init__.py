"""Device-side modules: batches stay uint8 until they are on the device.

``Normalize`` (uint8 → float, fused), ``MaskToLong`` (uint8 masks → int64),
``DevicePrefetcher`` / ``to_device`` (the next batch in flight on a side CUDA stream) and
batch augmentation on the device (``DeviceRandomHorizontalFlip``,
``DeviceRandomResizedCrop``, the colour ops, ``DeviceRandomAffine``,
``DeviceRandomErasing``, ``DeviceRandAugment``, ``DeviceTrivialAugmentWide``,
``DeviceAugMix``, ``DeviceMixUp``, ``DeviceCutMix``), and detection geometry with boxes as
``PaddedBoxes`` (``DeviceRandomIoUCrop``, ``DeviceLetterbox``; ``compact`` for counts).
Everything also runs on the CPU; CUDA is used, never required.
"""

from fastdata.gpu._boxes import PaddedBoxes, compact
from fastdata.gpu._detection import DeviceLetterbox, DeviceRandomIoUCrop
from fastdata.gpu._mix import DeviceCutMix, DeviceMixUp
from fastdata.gpu._steps import (
    DeviceAugMix,
    DeviceColorJitter,
    DeviceGaussianBlur,
    DeviceRandAugment,
    DeviceRandomAdjustSharpness,
    DeviceRandomAffine,
    DeviceRandomAutocontrast,
    DeviceRandomEqualize,
    DeviceRandomErasing,
    DeviceRandomGrayscale,
    DeviceRandomInvert,
    DeviceRandomPosterize,
    DeviceRandomSolarize,
    DeviceStepModule,
    DeviceTrivialAugmentWide,
)
from fastdata.gpu.augment import DeviceRandomHorizontalFlip, DeviceRandomResizedCrop
from fastdata.gpu.normalize import MaskToLong, Normalize
from fastdata.gpu.prefetch import DevicePrefetcher, to_device

__all__ = [
    "DeviceAugMix",
    "DeviceColorJitter",
    "DeviceCutMix",
    "DeviceGaussianBlur",
    "DeviceLetterbox",
    "DeviceMixUp",
    "DevicePrefetcher",
    "DeviceRandAugment",
    "DeviceRandomAdjustSharpness",
    "DeviceRandomAffine",
    "DeviceRandomAutocontrast",
    "DeviceRandomEqualize",
    "DeviceRandomErasing",
    "DeviceRandomGrayscale",
    "DeviceRandomHorizontalFlip",
    "DeviceRandomInvert",
    "DeviceRandomIoUCrop",
    "DeviceRandomPosterize",
    "DeviceRandomResizedCrop",
    "DeviceRandomSolarize",
    "DeviceStepModule",
    "DeviceTrivialAugmentWide",
    "MaskToLong",
    "Normalize",
    "PaddedBoxes",
    "compact",
    "to_device",
]

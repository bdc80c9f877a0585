"""A batch of uint8 images on the CPU, as datasets hand it to batch transforms: its type,
validation, per-sample sizes, the masks that follow it, and stacking into one array.

Datasets check their mask fields and stack decoded images with the same rules the
transforms apply to what they are given, so a batch is valid or not whatever path it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import numpy as np

# A batch of uint8 images: (B, H, W, C) / (B, H, W) array, or a list of (H, W, C) / (H, W)
# arrays when sizes differ (e.g. straight out of a JPEG decoder).
Images = Union[np.ndarray, list[np.ndarray]]  # noqa: UP007 - runtime alias on Python 3.10


def check_images(images: Images) -> Images:
    """Validate a NumPy batch (``TypeError``/``ValueError`` naming what was given)."""
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(
                f"images must be a (B, H, W, C) or (B, H, W) uint8 array, "
                f"got {images.shape} {images.dtype}"
            )
        return images
    if isinstance(images, list):
        for image in images:
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
                raise TypeError(f"images must be uint8 arrays, got {type(image).__name__}")
        return images
    raise TypeError(
        f"images must be a uint8 tensor, array or list of arrays, got {type(images).__name__}"
    )


def spatial_sizes(images: Images) -> list[tuple[int, int]]:
    """Per-sample ``(height, width)``."""
    if isinstance(images, np.ndarray):
        return [(int(images.shape[1]), int(images.shape[2]))] * images.shape[0]
    return [(int(image.shape[0]), int(image.shape[1])) for image in images]


def check_masks(images: Images, masks: Sequence[Images], names: Sequence[str] = ()) -> None:
    """Check that every mask batch has one ``(H, W)`` mask per image, of the image's size.

    Args:
        images: The image batch.
        masks: The mask batches.
        names: Optional field names of the masks, for the message.

    Raises:
        ValueError: A count or a size differs (the message names the mask and the sample).
    """
    sizes = spatial_sizes(images)
    for m, mask in enumerate(masks):
        name = repr(names[m]) if m < len(names) else f"masks[{m}]"
        if len(mask) != len(sizes):
            raise ValueError(f"mask {name} holds {len(mask)} samples but images hold {len(sizes)}")
        ranks = {mask.ndim - 1} if isinstance(mask, np.ndarray) else {x.ndim for x in mask}
        if ranks - {2}:
            raise ValueError(f"mask {name} must hold 2-D (H, W) uint8 masks")
        for k, size in enumerate(spatial_sizes(mask)):
            if size != sizes[k]:
                raise ValueError(
                    f"mask {name} of sample {k} is {size[0]}x{size[1]} but its image is "
                    f"{sizes[k][0]}x{sizes[k][1]}: masks must have their image's height and width"
                )


def stack_images(images: Images) -> np.ndarray:
    """One ``(B, H, W, C)`` uint8 array (a list must hold equal shapes)."""
    if isinstance(images, np.ndarray):
        return images
    shapes = {image.shape for image in images}
    if len(shapes) > 1:
        raise ValueError(
            f"cannot batch images of different sizes {sorted(shapes)[:4]}; add a transform "
            "that gives every image one size (CenterCrop, RandomResizedCrop, Resize with a "
            "(height, width))"
        )
    if not images:
        return np.empty((0, 0, 0, 3), np.uint8)
    return np.stack(images)

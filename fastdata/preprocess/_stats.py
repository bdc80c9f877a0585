"""Per-channel pixel statistics: gathered per sample in the workers, summed per shard, and
summed over shards into the manifest's ``stats`` (the mean and std that
:meth:`fastdata.gpu.Normalize.from_manifest` reads).

Sums, not means, travel between the steps, so that adding shards in order gives the same
floats whichever shards a resumed run reused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np


@dataclass(frozen=True)
class PixelStats:
    """Sums over the pixels of some samples of one field, per channel (0-255 scale).

    Attributes:
        samples: How many samples were summed.
        pixels: How many pixels per channel were summed (height x width per image,
            every element per array).
        sums: Per channel, the sum of the values.
        squares: Per channel, the sum of the squared values.
    """

    samples: int
    pixels: float
    sums: tuple[float, ...]
    squares: tuple[float, ...]

    @classmethod
    def of_image(cls, image: np.ndarray) -> PixelStats:
        """The statistics of one ``(H, W, C)`` uint8 image (OpenCV's one-pass mean and
        std, turned back into sums)."""
        pixels = float(image.shape[0] * image.shape[1])
        mean, std = cv2.meanStdDev(image)
        mean, std = mean.ravel(), std.ravel()
        sums = mean * pixels
        squares = (std * std + mean * mean) * pixels
        return cls(1, pixels, tuple(sums.tolist()), tuple(squares.tolist()))

    @classmethod
    def of_array(cls, array: np.ndarray) -> PixelStats:
        """The statistics of one array of any shape, as one channel."""
        flat = array.reshape(-1, 1).astype(np.float64)
        sums, squares = flat.sum(0), (flat * flat).sum(0)
        return cls(1, float(flat.shape[0]), tuple(sums.tolist()), tuple(squares.tolist()))

    def merge(self, other: PixelStats) -> PixelStats:
        """The statistics of both sets of samples (``self``'s first).

        Raises:
            ValueError: The two have different numbers of channels.
        """
        if len(self.sums) != len(other.sums):
            raise ValueError(
                f"cannot merge statistics of {len(self.sums)} and {len(other.sums)} channels"
            )
        return PixelStats(
            self.samples + other.samples,
            self.pixels + other.pixels,
            tuple(a + b for a, b in zip(self.sums, other.sums, strict=True)),
            tuple(a + b for a, b in zip(self.squares, other.squares, strict=True)),
        )

    @property
    def mean(self) -> list[float]:
        """Per-channel mean."""
        return [s / self.pixels for s in self.sums]

    @property
    def std(self) -> list[float]:
        """Per-channel population standard deviation."""
        return [
            math.sqrt(max(0.0, q / self.pixels - m * m))
            for q, m in zip(self.squares, self.mean, strict=True)
        ]

    def to_json(self) -> dict[str, Any]:
        """The sums as a shard's job record keeps them."""
        return {
            "count": self.samples,
            "pixels": self.pixels,
            "sum": list(self.sums),
            "sumsq": list(self.squares),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PixelStats:
        """The inverse of :meth:`to_json`."""
        return cls(data["count"], data["pixels"], tuple(data["sum"]), tuple(data["sumsq"]))

    def summary(self) -> dict[str, Any]:
        """Mean, std and sample count, as the manifest's ``stats`` holds them."""
        return {"mean": self.mean, "std": self.std, "count": self.samples}


def merge_fields(
    total: dict[str, PixelStats], part: dict[str, PixelStats]
) -> dict[str, PixelStats]:
    """``total`` with each field's statistics in ``part`` merged in (fields new to
    ``total`` start from ``part``'s)."""
    merged = dict(total)
    for name, stats in part.items():
        merged[name] = merged[name].merge(stats) if name in merged else stats
    return merged


class StatsTotals:
    """Running per-field sums of samples added one after another: the floats that
    folding :func:`merge_fields` over the same parts in the same order gives (the same
    additions), without building new objects for every sample."""

    def __init__(self) -> None:
        # field name -> [samples, pixels, sums, squares]
        self._totals: dict[str, list[Any]] = {}

    def add(self, part: dict[str, PixelStats]) -> None:
        """Add one sample's (or shard's) statistics, field by field.

        Raises:
            ValueError: A field's number of channels differs from what was added before.
        """
        for name, stats in part.items():
            total = self._totals.get(name)
            if total is None:
                self._totals[name] = [stats.samples, stats.pixels, [*stats.sums], [*stats.squares]]
                continue
            sums, squares = total[2], total[3]
            if len(sums) != len(stats.sums):
                raise ValueError(
                    f"cannot merge statistics of {len(sums)} and {len(stats.sums)} channels"
                )
            total[0] += stats.samples
            total[1] += stats.pixels
            for channel, value in enumerate(stats.sums):
                sums[channel] += value
            for channel, value in enumerate(stats.squares):
                squares[channel] += value

    def result(self) -> dict[str, PixelStats]:
        """The sums so far, per field in the order the fields were first added."""
        return {
            name: PixelStats(samples, pixels, tuple(sums), tuple(squares))
            for name, (samples, pixels, sums, squares) in self._totals.items()
        }

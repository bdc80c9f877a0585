"""MixUp and CutMix as device modules (the same kernel as the transforms': torch ops on
the batch wherever it is), with the transforms' ``normalize=``: mixed, then normalized,
in one call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from fastdata import ops
from fastdata._mixing import MixExecutor

if TYPE_CHECKING:
    from fastdata.gpu.normalize import Normalize


class _DeviceMix(nn.Module, MixExecutor):
    def __init__(
        self, *args: Any, layout: str = "CHW", seed: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__()
        # the description's arguments: alpha, num_classes, label_smoothing, p, mode
        self._setup(cast(Any, self.op_type)(*args, **kwargs), layout, seed)

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor, normalize: Normalize | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, soft_labels)``: the batch mixed on its device, called as
        :class:`fastdata.transforms.MixUp` is (the same arguments, results and errors).

        ``normalize``: a :class:`fastdata.gpu.Normalize` to apply to the mixed images; the
        result is ``normalize(mixed images)`` (float, in ``normalize``'s dtype and memory
        format; on a uint8 CPU batch mixed and normalized image by image, the mixed batch
        never written; elsewhere the two steps), the soft labels unchanged.
        """
        return self.mix(images, labels, normalize)

    def extra_repr(self) -> str:
        fields = repr(self.op).removeprefix(type(self.op).__name__)[1:-1]
        return f"{fields}, layout={self.layout!r}, seed={self._draws.seed}"


class DeviceMixUp(_DeviceMix):
    """:class:`fastdata.transforms.MixUp` as an ``nn.Module``: the device kernel of
    :class:`fastdata.ops.MixUp` (same arguments). Called as
    ``module(images, labels, normalize=None)``; with a :class:`~fastdata.gpu.Normalize`
    it returns the normalized mixed images.

    Example:
        >>> mix = DeviceMixUp(alpha=0.8, num_classes=1000).to(device)   # doctest: +SKIP
        >>> images, soft_labels = mix(batch, labels, normalize=normalize)
    """

    op_type = ops.MixUp
    op: ops.MixUp


class DeviceCutMix(_DeviceMix):
    """:class:`fastdata.transforms.CutMix` as an ``nn.Module``: the device kernel of
    :class:`fastdata.ops.CutMix` (same arguments), called as :class:`DeviceMixUp` is."""

    op_type = ops.CutMix
    op: ops.CutMix

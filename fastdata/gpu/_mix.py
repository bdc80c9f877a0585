"""MixUp and CutMix as device modules (the same kernel as the transforms': torch ops on
the batch wherever it is)."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from fastdata import ops
from fastdata._mixing import MixExecutor


class _DeviceMix(nn.Module, MixExecutor):
    def __init__(
        self, *args: Any, layout: str = "CHW", seed: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__()
        # the description's arguments: alpha, num_classes, label_smoothing, p, mode
        self._setup(cast(Any, self.op_type)(*args, **kwargs), layout, seed)

    def forward(
        self, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, soft_labels)``; see :class:`fastdata.transforms.MixUp`."""
        return self.mix(images, labels)

    def extra_repr(self) -> str:
        fields = repr(self.op).removeprefix(type(self.op).__name__)[1:-1]
        return f"{fields}, layout={self.layout!r}, seed={self._draws.seed}"


class DeviceMixUp(_DeviceMix):
    """:class:`fastdata.transforms.MixUp` as an ``nn.Module``: the device kernel of
    :class:`fastdata.ops.MixUp` (same arguments)."""

    op_type = ops.MixUp
    op: ops.MixUp


class DeviceCutMix(_DeviceMix):
    """:class:`fastdata.transforms.CutMix` as an ``nn.Module``: the device kernel of
    :class:`fastdata.ops.CutMix` (same arguments)."""

    op_type = ops.CutMix
    op: ops.CutMix

"""The one vocabulary of image layouts, shared by datasets and device modules.

A layout names the dims of one sample: ``"CHW"`` (channels first) or ``"HWC"`` (channels
last); a batch adds its leading ``B`` dim, so a ``"CHW"`` batch is ``(B, C, H, W)``.
Device modules also take ``"auto"``: they tell the two apart by which dim equals the
channel count. The batch spellings ``"BCHW"``/``"BHWC"`` of earlier releases still work
and warn (``FutureWarning``) with the name to use instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

LAYOUTS = ("CHW", "HWC")
AUTO = "auto"
_RENAMED = {"BCHW": "CHW", "BHWC": "HWC"}


def check_layout(layout: str, *, auto: bool = False, stacklevel: int = 2) -> str:
    """The layout name ``layout`` stands for, validated.

    Args:
        layout: ``"CHW"``, ``"HWC"``, ``"auto"`` when ``auto`` is true, or a renamed
            spelling (``"BCHW"``, ``"BHWC"``), which warns and maps to its new name.
        auto: Whether ``"auto"`` is allowed (device modules that detect the layout).
        stacklevel: Where a ``FutureWarning`` points, counted as ``warnings.warn`` counts
            from the caller (2: the caller's caller, the user's code when a constructor
            calls this directly).

    Raises:
        TypeError: ``layout`` is not a string.
        ValueError: ``layout`` is none of the allowed names.
    """
    allowed = (*LAYOUTS, AUTO) if auto else LAYOUTS
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a string, one of {allowed}, got {layout!r}")
    new = _RENAMED.get(layout)
    if new is not None:
        warnings.warn(
            f"layout={layout!r} is now spelled layout={new!r} (a sample's dims; the batch dim "
            "is implied); the old spelling will be removed in a future release",
            FutureWarning,
            stacklevel=stacklevel + 1,
        )
        return new
    if layout not in allowed:
        raise ValueError(f"layout must be one of {allowed}, got {layout!r}")
    return layout


def resolve_layout(shape: Sequence[int], layout: str, channels: int) -> str:
    """The layout of a 4-D batch of ``shape``: ``layout`` itself unless it is ``"auto"``,
    then the one whose channel dim alone equals ``channels``.

    Args:
        shape: The batch's shape ``(B, C, H, W)`` or ``(B, H, W, C)``.
        layout: A name :func:`check_layout` returned.
        channels: The channel count the caller expects.

    Raises:
        ValueError: ``"auto"`` with a batch whose dims 1 and 3 both (or neither) equal
            ``channels``.
    """
    if layout != AUTO:
        return layout
    first, last = shape[1] == channels, shape[3] == channels
    if first and not last:
        return "CHW"
    if last and not first:
        return "HWC"
    raise ValueError(
        f"layout='auto' cannot tell the channel dim of a batch of shape {tuple(shape)} "
        f"with {channels} channels; pass layout='CHW' or layout='HWC'"
    )

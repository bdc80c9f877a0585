"""The one vocabulary of image layouts, shared by datasets and device modules.

A layout names the dims of one sample: ``"CHW"`` (channels first) or ``"HWC"`` (channels
last); a batch adds its leading ``B`` dim, so a ``"CHW"`` batch is ``(B, C, H, W)``.
Device modules also take ``"auto"``: they tell the two apart by which dim equals the
channel count. The batch spellings ``"BCHW"``/``"BHWC"`` of earlier releases are refused
with the name to use instead.
"""

from __future__ import annotations

from collections.abc import Sequence

LAYOUTS = ("CHW", "HWC")
AUTO = "auto"
_FORMER_SPELLINGS = {"BCHW": "CHW", "BHWC": "HWC"}


def check_layout(layout: str, *, auto: bool = False) -> str:
    """The layout name ``layout`` stands for, validated.

    Args:
        layout: ``"CHW"``, ``"HWC"``, or ``"auto"`` when ``auto`` is true.
        auto: Whether ``"auto"`` is allowed (device modules that detect the layout).

    Raises:
        TypeError: ``layout`` is not a string.
        ValueError: ``layout`` is none of the allowed names (the message names the one to
            use for a former spelling, ``"BCHW"`` or ``"BHWC"``).
    """
    allowed = (*LAYOUTS, AUTO) if auto else LAYOUTS
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a string, one of {allowed}, got {layout!r}")
    if layout not in allowed:
        former = _FORMER_SPELLINGS.get(layout)
        hint = f" (now spelled {former!r}: a sample's dims, the batch dim is implied)"
        raise ValueError(f"layout must be one of {allowed}, got {layout!r}{hint if former else ''}")
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

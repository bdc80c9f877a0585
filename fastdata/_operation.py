"""``Operation``, the base of the augmentation descriptions (see :mod:`fastdata.ops`, which
exports it): a module of its own, so the description families below ``fastdata.ops``
subclass it without importing ``fastdata.ops``."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar


class Operation:
    """Base of the descriptions: what an operation makes of its input, declared up front.

    Attributes:
        draws_per_sample: Uniform draws in [0, 1) the operation takes per sample.
        reads_only: ``True``: it writes a new batch and never its input (datasets may hand
            it stored rows without a copy).
        keeps_size: ``False``: outputs have another height and width than their inputs.
    """

    draws_per_sample: ClassVar[int] = 0
    reads_only: ClassVar[bool] = False
    keeps_size: ClassVar[bool] = True

    @property
    def min_input_side(self) -> int | None:
        """The shortest input side the result stays the same picture down to (a JPEG
        decoder may decode at 1/2, 1/4 or 1/8 scale while the shorter side stays at least
        this); ``None``: the input must be decoded at full size."""
        return None

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The outputs' ``(height, width)`` for inputs of ``size``.

        Args:
            size: The inputs' ``(height, width)``, or ``None`` when it varies.

        Returns:
            The outputs' size, or ``None`` when it depends on each input.

        Raises:
            ValueError: Inputs of ``size`` are too small for this operation.
        """
        return size

    def arguments(self) -> tuple[Any, ...]:
        """The constructor's positional arguments that rebuild this description."""
        return tuple(getattr(self, field.name) for field in fields(self))  # type: ignore[arg-type]

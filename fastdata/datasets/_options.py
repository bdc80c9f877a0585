"""``ReadOptions``: how a dataset reads its samples, validated once for every dataset."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastdata._codec import DEFAULT_MAX_PIXELS, resolve_max_pixels
from fastdata._layout import check_layout
from fastdata.datasets._decoding import CropDecode, resolve_decode
from fastdata.errors import OnError

if TYPE_CHECKING:
    from fastdata.decode import Decoder


class _NotGiven:
    """The default of a dataset's read keywords: "not passed", told apart from a value
    equal to :class:`ReadOptions`' own default."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __reduce__(self) -> str:  # copies and unpickles to the one module-level instance
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()
"""Default of the read keywords of the datasets (``layout=NOT_GIVEN``): a keyword left
out takes its value from ``options=`` or from :class:`ReadOptions`' default."""


def check_num_threads(value: int | None) -> int | None:
    """``num_threads`` validated: a positive int, or ``None`` for the default.

    Raises:
        ValueError: ``value`` is neither.
    """
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"num_threads must be a positive int or None, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How :class:`ShardDataset` and :class:`RAMDataset` (and its ``from_*`` builders)
    read, decode and lay out samples; one value for all of them, checked when made.

    Pass it as ``options=``, or pass its fields as keyword arguments of the dataset (they
    build it); not both.

    Args:
        layout: ``"CHW"`` (images ``(B, C, H, W)``, a channels-last view) or ``"HWC"``.
        decode: ``True`` decodes encoded images on the CPU, ``False`` returns their bytes
            as 1-D uint8 tensors, a ``"cpu"`` :class:`~fastdata.decode.Decoder` decodes
            each image straight into its output size and crop, any other decoder
            (``"nvjpeg"``, ``"dali"``, a device output) whole batches in the training
            process (see :class:`ShardDataset`).
        decode_min_side: Decode JPEGs at 1/2, 1/4 or 1/8 scale while the shorter side
            stays at least this large (``decode=True`` only; default: the transform's
            ``min_input_side``).
        on_error: Undecodable bytes in a batch: ``"raise"``, ``"warn"`` or ``"skip"``.
        num_threads: Threads for the per-sample work of a batch (``None``: all usable
            CPUs in the main process, 1 in DataLoader workers).
        max_pixels: Images whose header claims more pixels (width x height) are refused
            before decoding, like a corrupt file; ``0`` or ``None``: no limit. Default:
            PIL's limit, 89,478,485.
        roles: Field name → role, overriding the manifest's (say ``{"seg": "mask"}``).

    Raises:
        TypeError: ``layout`` is not a string, ``on_error`` not a string, or ``decode``
            neither a bool nor a ``Decoder``.
        ValueError: A value is out of range, or ``decode_min_side`` is given with a
            ``Decoder``.
    """

    layout: str = "CHW"
    decode: bool | Decoder = True
    decode_min_side: int | None = None
    on_error: OnError | str = "raise"
    num_threads: int | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    roles: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        set_field = object.__setattr__  # frozen: the normalised values are stored once
        set_field(self, "layout", check_layout(self.layout))
        set_field(self, "on_error", OnError.parse(self.on_error))
        set_field(self, "max_pixels", resolve_max_pixels(self.max_pixels))
        check_num_threads(self.num_threads)
        _, crop_decode = resolve_decode(self.decode)
        side = self.decode_min_side
        if crop_decode is not None and side is not None:
            raise ValueError(
                f"decode_min_side={side!r} applies to decode=True only: a Decoder given as "
                "decode= picks the reduced JPEG scale from its output size"
            )
        if side is not None and (not isinstance(side, int) or isinstance(side, bool) or side < 1):
            raise ValueError(f"decode_min_side must be a positive int or None, got {side!r}")
        if self.roles is not None and not isinstance(self.roles, Mapping):
            raise TypeError(
                f"roles must be a mapping of field name to role, got {type(self.roles).__name__}"
            )

    @property
    def decodes(self) -> bool:
        """Whether encoded images are decoded (``decode`` is ``True`` or a ``Decoder``)."""
        return self.decode is not False

    @property
    def crop_decode(self) -> CropDecode | None:
        """A ``Decoder``'s geometry (output size, crop draws), or ``None`` for a bool."""
        return resolve_decode(self.decode)[1]

    @classmethod
    def from_arguments(cls, options: ReadOptions | None, **given: Any) -> ReadOptions:
        """The options a dataset was given: ``options``, or the keyword arguments that
        were passed (those not :data:`NOT_GIVEN`), never both. A keyword counts as
        passed whatever its value, its default included, so it is never silently
        dropped in favour of ``options``.

        Raises:
            TypeError: ``options`` is not a ``ReadOptions``, both it and keywords were
                given, or a keyword is not one of its fields.
        """
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise TypeError(f"unexpected read options {unknown}; allowed: {sorted(names)}")
        passed = {name: value for name, value in given.items() if value is not NOT_GIVEN}
        if options is None:
            return cls(**passed)
        if not isinstance(options, cls):
            raise TypeError(f"options must be a ReadOptions, got {type(options).__name__}")
        if passed:
            shown = ", ".join(f"{name}={value!r}" for name, value in sorted(passed.items()))
            raise TypeError(
                f"{', '.join(sorted(passed))} given both in options= and as keywords "
                f"({shown}); pass each read option once: in options= "
                "(dataclasses.replace(options, ...)) or as keywords"
            )
        return options

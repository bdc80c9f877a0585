"""The ``encoded`` kind: variable-length bytes per sample (image files, text)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fastdata._gather import gather_encoded
from fastdata.shards._field_kind import (
    Column,
    FieldKind,
    FieldSpecLike,
    Mapper,
    Region,
    checked_values_and_offsets,
    create_contiguous,
)

if TYPE_CHECKING:
    import h5py


class EncodedKind(FieldKind):
    """Variable-length bytes per sample (a JPEG or PNG file, UTF-8 text), stored as a group
    named after the field holding ``data``, one flat contiguous ``uint8`` blob, and
    ``offsets``, ``N + 1`` ``int64``: sample ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""

    name = "encoded"
    fixed_size = False
    #: Encodings that decode to ``(H, W, C)`` images ("image": any format OpenCV reads).
    image_encodings: ClassVar[tuple[str, ...]] = ("jpeg", "png", "image")

    @classmethod
    def check(cls, spec: FieldSpecLike) -> None:
        if np.dtype(spec.dtype) != np.uint8:
            raise ValueError(
                f"encoded field {spec.name!r} must have dtype 'uint8', got {spec.dtype!r}"
            )
        if spec.shape:
            raise ValueError(f"encoded field {spec.name!r} must have shape (), got {spec.shape}")
        if spec.encoding is None:
            raise ValueError(f"encoded field {spec.name!r} needs an encoding")

    @property
    def sample_nbytes(self) -> int:
        return 0

    @property
    def decodes_to_image(self) -> bool:
        return self.spec.encoding in self.image_encodings

    @property
    def sample_axes(self) -> str:
        return "HWC" if self.decodes_to_image else ""

    def describe(self) -> str:
        return f"encoded {self.spec.encoding}"

    def to_bytes(self, value: Any) -> bytes | memoryview:
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, np.ndarray):
            return value.tobytes()
        if isinstance(value, bytes):
            return value
        raise TypeError(f"field {self.spec.name!r} takes bytes, got {type(value).__name__}")

    def write(self, h5: h5py.File, column: Column, compression: str | None) -> list[Region]:
        group = h5.create_group(self.spec.name)
        group.attrs["encoding"] = self.spec.encoding or ""
        lengths = np.asarray(column.lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        group.create_dataset("offsets", data=offsets)
        total = int(offsets[-1])
        data = create_contiguous(group, "data", (total,), "uint8")
        offset = data.id.get_offset()
        if not total or offset is None:
            return []
        return [(column.path, column.offset, offset, total)]

    def open(self, h5: h5py.File, num_samples: int, mapper: Mapper) -> Any:
        data, offsets = checked_values_and_offsets(
            h5,
            self.spec.name,
            values_key="data",
            dtype="uint8",
            row_shape=(),
            num_samples=num_samples,
            kind="an encoded",
        )
        return mapper(data), offsets

    def read(self, view: Any, index: int) -> np.ndarray:
        blob, offsets = view
        return np.asarray(blob[offsets[index] : offsets[index + 1]])

    def gather(
        self,
        views: Callable[[int], Any],
        segments: np.ndarray,
        local: np.ndarray,
        out: np.ndarray | None = None,
        *,
        executor: Executor | None = None,
        tasks: int = 1,
    ) -> list[np.ndarray]:
        return gather_encoded(views, segments, local)

    def pack(self, view: Any) -> tuple[Any, np.ndarray | None]:
        return view

    def unpack(self, payload: np.ndarray, offsets: np.ndarray | None, num_samples: int) -> Any:
        return payload, offsets

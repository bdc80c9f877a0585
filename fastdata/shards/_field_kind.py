"""``FieldKind``: the interface every kind of field implements, and helpers they share.

Everything that depends on how one kind of field is stored lives in its class: which specs
are valid, the bytes per sample, how a :class:`~fastdata.shards.ShardWriter` stores a
shard's column, how a reader checks and views it, how one sample and a batch are read,
and how ``fastdata inspect`` describes it. Writer, reader and the datasets' stores call
these methods and never branch on the kind's name, so a new kind of field is one subclass
(registered in :mod:`fastdata.shards._kinds`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:
    import h5py

# h5py is imported where a file is written or opened, not here: preprocessing workers build
# field specs (and so their kinds) but never touch a file, and start faster without it.

# (source file, offset in it, offset in the shard, bytes): a copy the writer leaves to the
# kernel once HDF5 has laid out the file.
Region = tuple[Path, int, int, int]
# Maps a checked contiguous dataset into memory where it can (the reader's policy).
Mapper = Callable[["h5py.Dataset"], Any]

COPY_BLOCK_BYTES = 64 << 20
NUMERIC_KINDS = "biufc"  # bool, int, uint, float, complex: never object, string or void


@dataclass(frozen=True)
class Column:
    """What a writer collected for one field of a shard.

    Attributes:
        path: File holding the samples' bytes back to back.
        offset: Where sample 0 starts in ``path``.
        lengths: Bytes of each sample, for kinds whose samples vary in size (else empty).
        num_samples: Samples in the shard.
    """

    path: Path
    offset: int
    lengths: Sequence[int]
    num_samples: int


class FieldSpecLike(Protocol):
    """What a kind reads of its field: a :class:`~fastdata.shards.FieldSpec` (which
    looks its kind up in the registry, so the kinds name its attributes, not its class)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def axes(self) -> str: ...

    @property
    def encoding(self) -> str | None: ...


class FieldKind(ABC):
    """How one kind of field is stored, read and described (subclass per kind).

    A subclass sets ``name`` (the manifest's ``kind``) and ``fixed_size``, implements the
    abstract methods and is passed to :func:`register_field_kind`; ``spec.field_kind`` is
    then an instance bound to its field. Its layout inside a shard is its own; the two
    built-in kinds' layouts are in docs/FORMAT.md.

    Args:
        spec: The field this kind is bound to.
    """

    name: ClassVar[str]
    #: Every sample has ``sample_nbytes`` bytes, so a batch is one ``(B, *shape)`` array;
    #: ``False``: samples vary in size and a batch is a list.
    fixed_size: ClassVar[bool]
    #: Columns of the offsets :meth:`pack` returns: 1, a ``(N + 1,)`` array of offsets;
    #: more, a ``(N + 1, columns)`` array whose first column is the offsets and the others
    #: per-sample values (row ``N`` unused) that travel with them.
    offset_columns: ClassVar[int] = 1

    def __init__(self, spec: FieldSpecLike) -> None:
        self.spec = spec

    @classmethod
    @abstractmethod
    def check(cls, spec: FieldSpecLike) -> None:
        """``ValueError`` when ``spec`` is not a valid field of this kind.

        Args:
            spec: The field being created (from code or a manifest).
        """

    @property
    @abstractmethod
    def sample_nbytes(self) -> int:
        """Bytes per sample (0 when samples vary in size)."""

    @property
    def sample_axes(self) -> str:
        """Axis letters of one sample as a dataset yields it (``""``: not an image)."""
        return ""

    @property
    def image_size(self) -> tuple[int, int] | None:
        """``(height, width)`` shared by every stored sample (``None``: sizes vary, or
        the field holds no images)."""
        return None

    @property
    def variable_images(self) -> bool:
        """Whether samples are raw ``(H_i, W_i, C)`` images whose sizes vary, which a
        dataset gives its transform as they are (no decode)."""
        return False

    @property
    def decodes_to_image(self) -> bool:
        """Whether samples are encoded images that a dataset decodes to ``(H, W, C)``
        ``uint8`` (with ``decode=True``)."""
        return False

    @abstractmethod
    def describe(self) -> str:
        """One line for ``fastdata inspect``."""

    # -- writing ----------------------------------------------------------------------
    @abstractmethod
    def to_bytes(self, value: Any) -> bytes | memoryview:
        """One sample's stored bytes, as the writer appends them.

        Args:
            value: The sample's value given to ``ShardWriter.append``.

        Raises:
            TypeError: ``value`` has the wrong type or dtype (the message names the field).
            ValueError: ``value`` has the wrong shape.
        """

    def preallocate(self, h5: h5py.File, max_samples: int) -> int | None:
        """Lay out room for ``max_samples`` samples and return the file offset where
        sample 0 goes, so that fixed-size samples can be written in place; ``None`` (the
        default) when the kind is written only by :meth:`write`.

        Args:
            h5: The shard file being laid out.
            max_samples: Samples the shard will hold.
        """
        return None

    @abstractmethod
    def write(self, h5: h5py.File, column: Column, compression: str | None) -> list[Region]:
        """Create the field's datasets for one shard; returns the regions
        ``(source file, offset in it, offset in the shard, bytes)`` still to be copied
        into the file (HDF5 has allocated them; the kernel copies them).

        Args:
            h5: The shard file being built.
            column: The samples' spilled bytes.
            compression: ``None``, ``"gzip"`` or ``"lzf"`` (see ``ShardWriter``).
        """

    # -- reading ----------------------------------------------------------------------
    @abstractmethod
    def open(self, h5: h5py.File, num_samples: int, mapper: Mapper) -> Any:
        """Check the field's datasets in an open shard against the spec and return its
        view, what :meth:`read` and :meth:`gather` take.

        Args:
            h5: The open shard file.
            num_samples: Samples the manifest records for the shard.
            mapper: Maps a checked contiguous dataset into memory (or returns it as is).

        Raises:
            ValueError: A dataset is missing or differs from the spec (the message says
                what differs).
        """

    @abstractmethod
    def read(self, view: Any, index: int) -> np.ndarray:
        """One sample.

        Args:
            view: One segment's view (what :meth:`open` or :meth:`unpack` returned).
            index: Sample index inside the segment.
        """

    @abstractmethod
    def gather(
        self,
        views: Callable[[int], Any],
        segments: np.ndarray,
        local: np.ndarray,
        out: np.ndarray | None = None,
        *,
        executor: Executor | None = None,
        tasks: int = 1,
    ) -> np.ndarray | list[np.ndarray]:
        """Samples ``local`` of segments ``segments`` (what ``ShardReader.locate``
        returns), in that order: fixed-size kinds as one ``(B, *shape)`` array, others
        as a list.

        Args:
            views: Segment number → its view.
            segments: Segment of each sample.
            local: Index of each sample inside its segment.
            out: Destination of a fixed-size batch (allocated when ``None``).
            executor: Pool the copy loop is split on.
            tasks: Slices of the copy loop.
        """

    # -- one contiguous copy (RAM datasets) --------------------------------------------
    @abstractmethod
    def pack(self, view: Any) -> tuple[Any, np.ndarray | None]:
        """One segment's ``(payload, offsets)``, to be copied into one contiguous buffer:
        its samples as one array-like, and when samples vary in size their ``int64``
        offsets along the payload's first axis (``N + 1``, from 0, or ``(N + 1,
        offset_columns)`` with the offsets first; ``None`` for fixed-size kinds).

        Args:
            view: One segment's view (what :meth:`open` returned).
        """

    @abstractmethod
    def unpack(self, payload: np.ndarray, offsets: np.ndarray | None, num_samples: int) -> Any:
        """The view of samples held in one contiguous buffer: the inverse of :meth:`pack`.

        Args:
            payload: The samples' bytes, flat ``uint8``.
            offsets: Their offsets, flat (``None`` for fixed-size kinds; ``(N + 1) *
                offset_columns`` values when the kind packs more than one column).
            num_samples: Samples held.
        """


def create_contiguous(
    parent: h5py.Group, name: str, shape: tuple[int, ...], dtype: str
) -> h5py.Dataset:
    """A contiguous dataset whose file space is allocated now and never pre-filled."""
    import h5py  # noqa: PLC0415 - see the note at the top

    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    return parent.create_dataset(name, shape=shape, dtype=dtype, dcpl=dcpl, fill_time="never")


def checked_dataset(
    parent: h5py.Group, name: str, dtype: str, shape: tuple[int, ...]
) -> h5py.Dataset:
    """``parent[name]`` after checking it is a plain dataset of ``dtype`` and ``shape``:
    never a variable-length, string or compound type, external or virtual storage."""
    import h5py  # noqa: PLC0415 - see the note at the top of this module

    ds = parent.get(name)
    where = f"{parent.name.rstrip('/')}/{name}"
    if not isinstance(ds, h5py.Dataset):
        raise ValueError(f"{where} is missing or not a dataset")
    if ds.dtype != np.dtype(dtype) or ds.dtype.kind not in NUMERIC_KINDS or ds.dtype.metadata:
        raise ValueError(f"{where} has dtype {ds.dtype}, the manifest records {dtype}")
    if ds.shape != shape:
        raise ValueError(f"{where} has shape {ds.shape}, the manifest records {shape}")
    if ds.external or ds.is_virtual:
        raise ValueError(f"{where} keeps its data outside the shard file")
    return ds


def checked_values_and_offsets(
    h5: h5py.File,
    name: str,
    *,
    values_key: str,
    dtype: str,
    row_shape: tuple[int, ...],
    num_samples: int,
    kind: str,
) -> tuple[h5py.Dataset, np.ndarray]:
    """The group ``name`` of a field stored as values + offsets (sample ``i`` is
    ``values[offsets[i] : offsets[i + 1]]``), checked: a group holding ``values_key`` of
    ``dtype`` with rows of ``row_shape``, and ``num_samples + 1`` offsets running up from 0
    to its row count. ``kind`` names the field kind in the errors."""
    import h5py  # noqa: PLC0415 - see the note at the top of this module

    group = h5.get(name)
    if not isinstance(group, h5py.Group):
        raise ValueError(f"field {name!r} is not a group of {kind} field")
    offsets = np.asarray(checked_dataset(group, "offsets", "int64", (num_samples + 1,))[()])
    values = group.get(values_key)
    rows = values.shape[0] if isinstance(values, h5py.Dataset) and values.ndim else 0
    values = checked_dataset(group, values_key, dtype, (rows, *row_shape))
    if offsets[0] != 0 or offsets[-1] != rows or np.any(np.diff(offsets) < 0):
        raise ValueError(f"offsets of field {name!r} do not run from 0 up to {rows}")
    return values, offsets

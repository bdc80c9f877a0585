"""Collate for datasets whose ``__getitems__`` already returns a collated batch.

``DataLoader``'s default ``collate_fn`` would take such a batch apart as if it were a list
of samples. fastdata marks the first value of each batch (a zero-copy view of a private
tensor subclass, or a list subclass) and registers that type with PyTorch's collate
extension mechanism (``torch.utils.data._utils.collate.default_collate_fn_map``): the
default collate then hands the batch on untouched, as :func:`passthrough_collate` does,
and both give back plain tensors and lists.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map


class _Marked(torch.Tensor):
    """A tensor marked for the default collate that otherwise works as a plain one.

    Operations on it return plain tensors, except ``detach()``, which keeps the type as
    ``torch.nn.Parameter(value)`` requires. Copies, pickles and ``torch.save`` give plain
    tensors (a parameter made from one gives a plain ``Parameter``), so the private type
    never reaches a file or another process.
    """

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.detach and type(out) is torch.Tensor:
            return out.as_subclass(cls)
        return out

    def _plain(self) -> torch.Tensor:
        """The same memory as a plain tensor, or a plain ``Parameter`` if this is one."""
        plain = self.as_subclass(torch.Tensor)
        if getattr(self, "_is_param", False):  # torch.nn.Parameter(value) marks it so
            return torch.nn.Parameter(torch.Tensor.detach(plain), self.requires_grad)
        return plain

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self._plain().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        if id(self) not in memo:
            plain = self._plain()
            if type(plain) is torch.Tensor and not plain.is_leaf:
                plain = torch.Tensor.detach(plain)  # deepcopy takes leaves only, as for tensors
            memo[id(self)] = copy.deepcopy(plain, memo)
        return memo[id(self)]

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        return repr(self._plain())


class _CollatedRow(_Marked):
    """``batch[0]`` of a marked one-field batch: what the default collate dispatches on."""


class _CollatedTensor(_Marked):
    """Marks a batch tensor ``__getitems__`` already collated (first field, or the only one).

    As :class:`_Marked`; indexing it returns a :class:`_CollatedRow`, so that the default
    collate recognises a one-field batch too.
    """

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_function__(func, types, args, kwargs)
        if func is torch.Tensor.__getitem__ and type(out) is torch.Tensor:
            return out.as_subclass(_CollatedRow)
        return out


class _CollatedList(list):
    """Marks a list field (encoded bytes, strings) at the head of a collated batch."""


def mark_collated(batch: Any) -> Any:
    """``batch`` with its first value marked as already collated (no data copied).

    Args:
        batch: What ``__getitems__`` returns: a tuple of fields (tensors or lists), a bare
            ``(B, ...)`` tensor (one field) or a bare list (one encoded field).
    """
    if type(batch) is torch.Tensor:
        return batch.as_subclass(_CollatedTensor)
    if isinstance(batch, tuple) and batch:
        return (_mark(batch[0]), *batch[1:])
    if isinstance(batch, list) and batch and isinstance(batch[0], torch.Tensor):
        return [_mark(batch[0]), *batch[1:]]
    return batch


def _mark(value: Any) -> Any:
    if type(value) is torch.Tensor:
        return value.as_subclass(_CollatedTensor)
    if type(value) is list:
        return _CollatedList(value)
    return value


def _unmark(value: Any) -> Any:
    if isinstance(value, _CollatedTensor | _CollatedRow):
        return value.as_subclass(torch.Tensor)
    if isinstance(value, _CollatedList):
        return list(value)
    return value


def unmark_collated(batch: Any) -> Any:
    """``batch`` with plain types again (the inverse of :func:`mark_collated`)."""
    if isinstance(batch, _CollatedTensor):
        return _unmark(batch)
    if isinstance(batch, tuple) and batch and isinstance(batch[0], _CollatedTensor | _CollatedList):
        return (_unmark(batch[0]), *batch[1:])
    if isinstance(batch, list) and batch and isinstance(batch[0], _CollatedTensor):
        return [_unmark(batch[0]), *batch[1:]]
    return batch


def is_collated(batch: Any) -> bool:
    """Whether ``batch`` came marked from a fastdata ``__getitems__``."""
    if isinstance(batch, _CollatedTensor):
        return True
    return (
        isinstance(batch, tuple | list)
        and bool(batch)
        and isinstance(batch[0], _CollatedTensor | _CollatedList)
    )


def _collate_marked(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s handler for a marked batch: hand it on untouched."""
    return unmark_collated(batch)


default_collate_fn_map[_CollatedTensor] = _collate_marked
default_collate_fn_map[_CollatedList] = _collate_marked
default_collate_fn_map[_CollatedRow] = _collate_marked


def passthrough_collate(batch: Any) -> Any:
    """Return a batch that ``__getitems__`` already collated, untouched.

    ``DataLoader`` calls ``collate_fn`` on whatever the dataset's ``__getitems__``
    returned. fastdata datasets return a finished batch (a tuple of tensors, or of a list
    of encoded-byte tensors and tensors). The default collate recognises these batches too
    (see the module docs); this function states it explicitly and is the default of
    :meth:`~fastdata.datasets.ShardDataset.loader`.

    A ``list`` of samples is what ``DataLoader`` hands over when it fetched samples one by
    one (a dataset without ``__getitems__``); it is collated with ``default_collate`` so
    this function is safe with any dataset.

    In a DataLoader worker, each list of tensors after the first field of a tuple batch
    (boxes, box labels) leaves the worker as one buffer and arrives as the same list of
    tensors (views of that buffer), instead of one shared-memory segment per tensor; each
    small tensor there (labels) travels as bytes in the queue message.

    Example:
        >>> loader = DataLoader(ds, batch_size=64, collate_fn=passthrough_collate)  # doctest: +SKIP
    """
    if is_collated(batch):
        return unmark_collated(batch)
    if isinstance(batch, list):
        return default_collate(batch)
    return pack_for_transfer(batch)


RAGGED_MODES = ("list", "padded")


def pad_ragged(
    items: Sequence[torch.Tensor], pad_value: float = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``B`` tensors ``(N_i, *tail)`` as one ``(B, max_N, *tail)`` tensor and ``(B,)`` int64
    ``counts`` (rows past ``counts[i]`` hold ``pad_value``): the fixed shape a compiled model
    wants.

    Raises:
        ValueError: The items' tails or dtypes differ.
    """
    if not items:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.int64)
    tails = {tuple(item.shape[1:]) for item in items}
    dtypes = {item.dtype for item in items}
    if len(tails) > 1 or len(dtypes) > 1:
        raise ValueError(
            f"variable-length items must share their row shape and dtype to be padded, got "
            f"{sorted(tails)[:3]} {sorted(map(str, dtypes))[:3]}"
        )
    counts = torch.tensor([len(item) for item in items], dtype=torch.int64)
    longest = int(counts.max()) if len(counts) else 0
    padded = torch.full((len(items), longest, *tails.pop()), pad_value, dtype=items[0].dtype)
    for row, item in enumerate(items):
        padded[row, : len(item)] = item
    return padded, counts


class RaggedCollate:
    """A ``collate_fn`` for fastdata batches with variable-length fields (boxes, box labels).

    ``"list"`` (the datasets' own form) hands each such field on as a list of ``(N_i, ...)``
    tensors; ``"padded"`` turns each into a ``(padded, counts)`` pair:
    ``(B, max_N, ...)`` padded with ``pad_value`` and ``(B,)`` int64 counts.

    Args:
        ragged: ``"list"`` or ``"padded"``.
        fields: Positions (in the batch tuple) of the variable-length fields; ``None``: every
            list of tensors with at least one axis.
        pad_value: What padded rows hold.

    Example:
        >>> loader = ds.loader(batch_size=16, ragged="padded")           # doctest: +SKIP
        >>> images, (boxes, counts), (labels, _) = next(iter(loader))
    """

    def __init__(
        self, ragged: str = "padded", fields: Sequence[int] | None = None, pad_value: float = 0
    ) -> None:
        if ragged not in RAGGED_MODES:
            raise ValueError(f"ragged must be one of {RAGGED_MODES}, got {ragged!r}")
        self.ragged = ragged
        self.fields = None if fields is None else tuple(fields)
        self.pad_value = pad_value

    def __call__(self, batch: Any) -> Any:
        batch = passthrough_collate(batch)
        if self.ragged == "list":
            return batch
        single = not isinstance(batch, tuple)
        values = [batch] if single else list(batch)
        for position, value in enumerate(values):
            chosen = position in self.fields if self.fields is not None else True
            if chosen and _is_ragged(value):
                values[position] = pad_ragged(value, self.pad_value)
        return values[0] if single else tuple(values)

    def __repr__(self) -> str:
        return f"RaggedCollate(ragged={self.ragged!r}, fields={self.fields!r})"


def _is_ragged(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, torch.Tensor) and item.dim() >= 1 for item in value
    )


# Lists of tensors above this size travel as they are (each tensor its own shared memory).
_PACKED_MAX_BYTES = 1 << 20


class _PackedList(list[torch.Tensor]):
    """A list of small tensors (a batch's boxes or box labels) that a DataLoader worker
    sends as one buffer of bytes in the queue message.

    PyTorch sends every tensor out of a worker in a shared-memory segment of its own, with
    a file descriptor passed over a socket per tensor: for a batch's 16 boxes tensors and 16
    box-label tensors that costs more than reading and transforming the batch. Unpickled,
    it is a plain ``list`` of tensors (views of one buffer), the same values and shapes.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        items: list[torch.Tensor] = list(self)
        if not _packable(items):
            return (list, (items,))
        dtype = items[0].dtype
        shapes = [tuple(item.shape) for item in items]
        flat = torch.cat([item.detach().reshape(-1) for item in items]) if items else None
        return (_unpack, (bytearray() if flat is None else _bytes_of(flat), dtype, shapes))


class _PackedTensor(_Marked):
    """A small tensor of a batch (its labels) that a DataLoader worker sends as bytes in
    the queue message.

    PyTorch sends every tensor out of a worker in shared memory: a segment made for it,
    its file descriptor handed over a socket (a connection and an authentication handshake
    each), a mapping made in the training process, each batch. For the few hundred bytes
    of a batch's labels that costs more CPU than the bytes themselves. Unpickled, it is a
    plain tensor: the same values, dtype and shape (contiguous).
    """

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain = self._plain()
        if type(plain) is not torch.Tensor or plain.requires_grad:
            return plain.__reduce_ex__(protocol)
        return (_tensor_from_bytes, (_bytes_of(plain), plain.dtype, tuple(plain.shape)))


def _tensor_from_bytes(data: bytearray, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def _bytes_of(tensor: torch.Tensor) -> bytearray:
    """A copy of the values of a CPU tensor of any dtype (bfloat16 too, which NumPy lacks)."""
    return bytearray(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def _as_bytes(item: Any) -> bool:
    """Whether ``item`` is a plain CPU tensor whose values can travel as bytes."""
    return type(item) is torch.Tensor and item.device.type == "cpu" and not item.requires_grad


def _packable(items: list[Any]) -> bool:
    if not all(_as_bytes(item) for item in items):
        return False
    if items and any(item.dtype != items[0].dtype for item in items):
        return False
    return sum(item.numel() * item.element_size() for item in items) <= _PACKED_MAX_BYTES


def _unpack(data: bytearray, dtype: torch.dtype, shapes: list[tuple[int, ...]]) -> list[Any]:
    sizes = [math.prod(shape) for shape in shapes]
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(sum(sizes), dtype=dtype)
    return [part.view(shape) for part, shape in zip(flat.split(sizes), shapes, strict=True)]


def pack_for_transfer(batch: Any) -> Any:
    """``batch`` with its fields after the first (which marks the batch as collated) set
    to travel out of a DataLoader worker cheaply: lists of tensors as one buffer each (see
    :class:`_PackedList`), small tensors in plain memory as bytes
    (:class:`_PackedTensor`); unchanged outside a worker, where nothing is pickled."""
    if get_worker_info() is None or not isinstance(batch, tuple):
        return batch
    return tuple(_packed(value, position) for position, value in enumerate(batch))


def _packed(value: Any, position: int) -> Any:
    if not position:
        return value
    if type(value) is list:
        return _PackedList(value)
    if (
        _as_bytes(value)
        and not value.is_shared()  # large batches are made in shared memory: sent as is
        and value.numel() * value.element_size() <= _PACKED_MAX_BYTES
    ):
        return value.as_subclass(_PackedTensor)
    return value

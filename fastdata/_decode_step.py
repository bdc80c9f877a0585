"""The decode step every path that decodes whole batches takes: a dataset given a
:class:`~fastdata.decode.Decoder` that runs on whole batches as ``decode=`` (in
``__getitems__`` or its ``dataset.loader(...)``) and :class:`~fastdata.decode.DecodingLoader`.

Decode a batch's encoded images (named for error messages, bad samples handled by a given
``on_error`` policy), then keep the rows of the other fields whose image decoded
(:func:`decode_batch`, :class:`DecodedBatches`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from fastdata._fields import moved_roles
from fastdata._transfer import copy_to_device
from fastdata.errors import OnError

if TYPE_CHECKING:
    from fastdata.decode import DecodedBatch, Decoder


def described(decoder: Decoder) -> str:
    """A decoder in an error message: its backend and device."""
    return f"<{decoder.backend!r} decoder on {str(decoder.device)!r}>"


def check_field(field: Any, position: int) -> None:
    """``field`` holds one entry per sample: a tensor, a list or a tuple."""
    if not isinstance(field, torch.Tensor | list | tuple):
        raise TypeError(
            f"batch element {position} must be a tensor or a list with one entry per sample, "
            f"got {type(field).__name__}"
        )


def take_rows(field: Any, rows: torch.Tensor, position: int) -> Any:
    """The ``rows`` of a per-sample field (a tensor, or a list/tuple of per-sample items)."""
    check_field(field, position)
    if isinstance(field, torch.Tensor):
        return field.index_select(0, copy_to_device(rows, field.device))
    return [field[i] for i in rows.tolist()]


def kept_rows(field: Any, kept: torch.Tensor, total: int, position: int) -> Any:
    """The rows ``kept`` of ``field``; the field itself when all ``total`` samples were
    kept, so a pinned tensor stays pinned (and is not copied)."""
    if int(kept.numel()) == total:
        check_field(field, position)
        return field
    return take_rows(field, kept, position)


class EncodedBatch(NamedTuple):
    """A batch to decode: its encoded images, the fields that follow them (one entry per
    sample each), what each image is in a :class:`~fastdata.DecodeError` (``None``: the
    decoder's ``"batch item k"``), and ``(epoch, dataset indices)`` of its samples, which
    key their crop draws (``None``: the decoder's stream; see
    :meth:`~fastdata.decode.Decoder.decode`)."""

    encoded: Sequence[Any]
    fields: list[Any]
    sources: list[str] | None = None
    keys: tuple[int, list[int]] | None = None


class DecodedFields(NamedTuple):
    """A decoded batch: ``(K, C, H, W)`` uint8 images on the decoder's device
    (channels_last), the fields' rows of the K samples that decoded, and the number of
    samples the batch had."""

    images: torch.Tensor
    fields: list[Any]
    total: int


@contextmanager
def _policy(decoder: Decoder, policy: OnError | None) -> Iterator[None]:
    """While inside, ``decoder`` handles bad samples by ``policy`` (``None``: its own)."""
    if policy is None or policy is decoder.on_error:
        yield
        return
    saved = decoder.on_error
    keeps = getattr(decoder, "keep_damaged", None)  # the cpu backend's, set from on_error
    decoder.on_error = policy
    if keeps is not None:
        decoder.keep_damaged = policy is OnError.WARN  # type: ignore[attr-defined]
    try:
        yield
    finally:
        decoder.on_error = saved
        if keeps is not None:
            decoder.keep_damaged = keeps  # type: ignore[attr-defined]


def _follow(decoded: DecodedBatch, batch: EncodedBatch) -> DecodedFields:
    total = len(batch.encoded)
    fields = [kept_rows(field, decoded.kept, total, i + 1) for i, field in enumerate(batch.fields)]
    return DecodedFields(decoded.images, fields, total)


def decode_batch(
    decoder: Decoder, batch: EncodedBatch, policy: OnError | None = None
) -> DecodedFields:
    """Decode one batch now (``decoder.decode``) and keep its fields' rows alike.

    ``policy``: how bad samples are handled (``None``: the decoder's ``on_error``)."""
    with _policy(decoder, policy):
        decoded = decoder.decode(batch.encoded, sources=batch.sources, keys=batch.keys)
    return _follow(decoded, batch)


class _Reading:
    """The batches a stream read and has not handed out yet, shared by its generators
    (which hold this, never the iterator that holds them: a loop that drops the iterator
    closes its generators at once, not at a garbage collection that may come in a
    forked DataLoader worker)."""

    def __init__(self) -> None:
        self.waiting: deque[EncodedBatch] = deque()
        self.count = [0]  # len(waiting), in a list that a loader's state may keep


def _encoded(batches: Iterable[EncodedBatch], reading: _Reading) -> Iterator[Sequence[Any]]:
    for batch in batches:
        reading.waiting.append(batch)
        reading.count[0] += 1
        yield batch.encoded


def _sources(reading: _Reading) -> Iterator[list[str] | None]:
    while True:  # the decoder reads these right after each batch
        yield reading.waiting[-1].sources if reading.waiting else None


def _keys(reading: _Reading) -> Iterator[tuple[int, list[int]] | None]:
    while True:  # as _sources
        yield reading.waiting[-1].keys if reading.waiting else None


def _decoded(
    decoder: Decoder,
    policy: OnError | None,
    batches: Iterable[EncodedBatch],
    reading: _Reading,
) -> Iterator[DecodedBatch]:
    with _policy(decoder, policy):
        encoded, sources, keys = _encoded(batches, reading), _sources(reading), _keys(reading)
        yield from decoder.decode_stream(encoded, sources=sources, keys=keys)


class DecodedBatches(Iterator[DecodedFields]):
    """``batches`` decoded in order through ``decoder.decode_stream`` (a backend may start
    decoding the next batch before it hands out this one), each with its fields' rows
    kept alike.

    ``policy`` (``None``: the decoder's ``on_error``) is the decoder's from the first batch
    until the stream ends or is dropped, not only while a batch is asked for: a backend may
    decode (and handle errors) on a thread of its own between two batches (nvJPEG).

    Attributes:
        read_ahead: Batches read from ``batches`` and not handed out yet (not consumed: a
            resumable loader leaves them out of its state).
    """

    def __init__(
        self, decoder: Decoder, batches: Iterable[EncodedBatch], policy: OnError | None = None
    ) -> None:
        self.decoder = decoder
        self.policy = policy
        self._reading = _Reading()
        self._stream = _decoded(decoder, policy, batches, self._reading)

    @property
    def read_ahead(self) -> int:
        return self._reading.count[0]

    def read_ahead_count(self) -> Callable[[], int]:
        """A function that gives :attr:`read_ahead` and holds nothing else of this
        iterator (a loader keeps it in its state; the iterator, and the DataLoader workers
        behind it, may then end as soon as the loop drops it)."""
        count = self._reading.count
        return lambda: count[0]

    def __next__(self) -> DecodedFields:
        decoded = next(self._stream)
        self._reading.count[0] -= 1
        return _follow(decoded, self._reading.waiting.popleft())


def refuse_moved_fields(roles: Mapping[str, str], decoder: Decoder) -> None:
    """Refuse fields whose role a geometric transform moves (``mask``, ``boxes``): the
    decoder's resize and crop would leave them misaligned with the images.

    Raises:
        ValueError: Naming the first such field.
    """
    geometric = set(moved_roles())
    for name, role in roles.items():
        if role in geometric:
            raise ValueError(
                f"field {name!r} (role {role!r}) would not follow the decoder's resize and "
                f"crop to {decoder.size}: read it with the dataset's own decode (decode=True "
                "and a transform, which moves masks and boxes) or leave it out of fields"
            )

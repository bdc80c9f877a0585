"""Decoding whole batches with a :class:`~fastdata.decode.Decoder` in the training process.

A GPU decoder (``nvjpeg``, ``dali`` on a device) cannot run in forked DataLoader workers
(CUDA does not survive a fork), and a DALI pipeline holds threads that a fork leaves behind.
So a dataset given such a decoder as ``decode=`` decodes in the process that calls it:
``__getitems__`` decodes its batch there; ``dataset.loader(...)`` has its batches read as
encoded bytes (in the workers, if any) and decodes each one after them, in this process,
scheduling the next batch on the decoder while the loop uses this one. The decode step
itself is :mod:`fastdata._decode_step`, which :class:`~fastdata.decode.DecodingLoader`
runs too.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import get_worker_info

from fastdata._decode_step import (
    DecodedBatches,
    DecodedFields,
    EncodedBatch,
    decode_batch,
    described,
    refuse_moved_fields,
)
from fastdata.datasets._collate import unmark_collated
from fastdata.errors import OnError

if TYPE_CHECKING:
    from fastdata.decode import Decoder, DecoderRecipe
    from fastdata.shards import FieldSpec


def decodes_batches(decode: object) -> bool:
    """Whether ``decode`` (a dataset's ``decode=``) is a decoder the dataset runs on whole
    batches in the training process: every backend but ``"cpu"``, and a ``"cpu"`` decoder
    whose output goes to a device. (A ``"cpu"`` decoder on the CPU is run per sample, in the
    dataset's threads and its DataLoader workers.)"""
    backend = getattr(decode, "backend", None)
    device = getattr(decode, "device", None)
    if not isinstance(backend, str) or not isinstance(device, torch.device):
        return False
    return backend != "cpu" or device.type != "cpu"


class BatchDecode:
    """A dataset's ``decode=`` decoder, run on the dataset's whole batches in this process.

    The batch holds, in ``fields`` order, the encoded images of the field at ``image``
    (a list of 1-D uint8 tensors) and the other fields as the dataset reads them. Decoded:
    the images ``(K, C, H, W)`` uint8 on the decoder's device (a ``(K, H, W, C)`` view for
    ``layout="HWC"``), the other fields' rows of the K samples that decoded.

    Args:
        decoder: From :func:`~fastdata.decode.create_decoder`.
        image: Position of the encoded image field in the batch.
        count: Number of fields in the batch (one: the batch is that field, bare).
        layout: ``"CHW"`` or ``"HWC"``.
        policy: The dataset's ``on_error``, used instead of the decoder's.
        source: Where a sample came from (a file, a shard row), by dataset index: a
            decode error names sample ``i`` ``"dataset[i], <source>"``.
    """

    def __init__(
        self,
        decoder: Decoder,
        *,
        image: int,
        count: int,
        layout: str,
        policy: OnError,
        source: Callable[[int], str],
    ) -> None:
        # None in a copy in another process until it decodes (made there from the recipe)
        self.decoder: Decoder | None = decoder
        self.recipe: DecoderRecipe | None = decoder.recipe()
        self.recipe_problem = ""  # why the recipe did not travel with a copy
        self.image = image
        self.count = count
        self.layout = layout
        self.policy = policy
        self.source = source
        self.description = described(decoder)

    def __getstate__(self) -> dict[str, Any]:
        # The decoder's threads, pipelines and device state do not travel: a copy in a
        # DataLoader worker only reads encoded bytes for the loader here, and a copy in
        # another training process (a rank given it by share_on_node) makes its own decoder
        # from the recipe when it first decodes.
        state = {**self.__dict__, "decoder": None}
        try:
            pickle.dumps(self.recipe)
        except Exception as error:  # an argument that does not pickle (a lambda, ...)
            state["recipe"] = None
            state["recipe_problem"] = f"; its arguments do not pickle ({error})"
        return state

    def _decoder(self) -> Decoder:
        if self.decoder is None:
            if self.recipe is None:
                raise RuntimeError(
                    f"decode={self.description} stayed in the process that made the dataset"
                    f"{self.recipe_problem}; this copy cannot decode: make the dataset (and "
                    "its decoder) in this process"
                )
            self.decoder = self.recipe.make()
        return self.decoder

    def refuse_in_worker(self) -> None:
        """Refuse to decode inside a DataLoader worker, in one line.

        Raises:
            RuntimeError: Inside a DataLoader worker process.
        """
        if get_worker_info() is not None:
            raise RuntimeError(
                f"decode={self.description} decodes in the training process, not in "
                "DataLoader workers (CUDA and decoder threads do not survive a fork): iterate "
                "the dataset with dataset.loader(...), whose workers read the encoded bytes "
                "and which decodes each batch after them, or use num_workers=0"
            )

    def _split(self, batch: Any, indices: Sequence[int] | None, epoch: int | None) -> EncodedBatch:
        """The batch read for samples ``indices`` of ``epoch`` (``None``: not known), to
        decode: named by dataset index, its crops drawn from ``(seed, epoch, index)``."""
        batch = unmark_collated(batch)
        values = list(batch) if isinstance(batch, tuple) else [batch]
        encoded = values.pop(self.image)
        if indices is None or len(indices) != len(encoded):
            # not known, or the dataset left samples out: named by batch item, drawn from
            # the decoder's stream
            return EncodedBatch(encoded, values)
        samples = [int(i) for i in indices]
        sources = [self._named(i) for i in samples]
        keys = None if epoch is None else (epoch, samples)
        return EncodedBatch(encoded, values, sources, keys)

    def _named(self, index: int) -> str:
        return f"dataset[{index}], {self.source(index)}"

    def _fields(self, decoded: DecodedFields) -> tuple[Any, ...]:
        images = decoded.images
        if self.layout == "HWC":
            images = images.permute(0, 2, 3, 1)
        values = list(decoded.fields)
        values.insert(self.image, images)
        return tuple(values)

    def _join(self, decoded: DecodedFields) -> Any:
        """The decoded batch as ``__getitems__`` returns one (the bare field for one)."""
        values = self._fields(decoded)
        return values if self.count > 1 else values[0]

    def decode(
        self,
        batch: tuple[Any, ...],
        indices: Sequence[int],
        policy: OnError,
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Decode the fields the dataset read for samples ``indices`` (in ``fields``
        order) now, bad samples handled by ``policy``; with the ``epoch`` they belong to,
        a seeded decoder draws each crop from ``(seed, epoch, index)``, else from its
        stream."""
        encoded = self._split(batch, indices, epoch)
        return self._fields(decode_batch(self._decoder(), encoded, policy))

    def stream(
        self,
        batches: Iterator[Any],
        indices: Callable[[], list[int] | None],
        epoch: int | None,
    ) -> _JoinedBatches:
        """The loader's batches (encoded) decoded in order, ahead by one where the backend
        schedules ahead; ``indices()`` gives the dataset indices of the batch just read,
        ``epoch`` the epoch they all belong to (their crops drawn as :meth:`decode` says)."""

        def encoded() -> Iterator[EncodedBatch]:
            for batch in batches:
                yield self._split(batch, indices(), epoch)

        batches_decoded = DecodedBatches(self._decoder(), encoded(), self.policy)
        return _JoinedBatches(batches_decoded, self._join)


class _JoinedBatches(Iterator[Any]):
    """Decoded batches put back in the dataset's field order."""

    def __init__(self, decoded: DecodedBatches, join: Callable[[DecodedFields], Any]) -> None:
        self._decoded = decoded
        self._join = join

    def read_ahead_count(self) -> Callable[[], int]:
        """See :meth:`DecodedBatches.read_ahead_count`."""
        return self._decoded.read_ahead_count()

    def __next__(self) -> Any:
        return self._join(next(self._decoded))


def batch_decode_for(
    decode: object,
    *,
    fields: Sequence[str],
    specs: Mapping[str, FieldSpec],
    transform: object,
    decode_min_side: int | None,
    layout: str,
    policy: OnError,
    source: Callable[[int], str],
) -> BatchDecode | None:
    """The :class:`BatchDecode` of a dataset's ``decode=`` (``None``: not a decoder run on
    whole batches, see :func:`decodes_batches`), checked against what the dataset returns.

    Raises:
        ValueError: A transform or ``decode_min_side`` is given, ``fields`` hold no
            encoded image field or more than one, or a field the decoder's crop would
            leave misaligned (role ``mask`` or ``boxes``).
    """
    if not decodes_batches(decode):
        return None
    decoder: Decoder = decode  # type: ignore[assignment]
    if transform is not None:
        raise ValueError(
            f"transform={transform!r} with decode={described(decoder)}: the decoder's output goes "
            "straight to the batch (on its device), so a dataset transform cannot follow it; "
            "give transform=None and augment the decoded batch (fastdata.gpu modules), or "
            "decode with a 'cpu' decoder on the CPU"
        )
    if decode_min_side is not None:
        raise ValueError(
            f"decode_min_side={decode_min_side!r} applies to decode=True only: a Decoder "
            "given as decode= picks the reduced JPEG scale from its output size"
        )
    encoded = [
        position
        for position, name in enumerate(fields)
        if specs[name].field_kind.decodes_to_image and not specs[name].field_kind.fixed_size
    ]
    if len(encoded) != 1:
        raise ValueError(
            f"decode={described(decoder)} decodes one encoded image field, but fields "
            f"{tuple(fields)} hold {len(encoded)} "
            f"({', '.join(repr(fields[p]) for p in encoded) or 'none'})"
        )
    others = {name: specs[name].role for name in fields if name != fields[encoded[0]]}
    refuse_moved_fields(others, decoder)
    return BatchDecode(
        decoder,
        image=encoded[0],
        count=len(fields),
        layout=layout,
        policy=policy,
        source=source,
    )

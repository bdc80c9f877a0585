"""Decode batches of encoded images as they come out of a DataLoader.

CUDA cannot run in forked DataLoader workers, so with a GPU decoder the workers only read
encoded bytes (cheap) and the main process decodes each batch on the device (nvJPEG,
DALI). With the ``cpu`` decoder and a ``DataLoader`` that has workers, decoding runs in
the workers instead (one decoding thread each), so that every worker decodes in parallel
and ships one dense uint8 batch instead of a list of byte tensors.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

# The decode step a dataset given a decoder as decode= runs too: one copy.
from fastdata._decode_step import (
    DecodedBatches,
    EncodedBatch,
    decode_batch,
    refuse_moved_fields,
    take_rows,
)
from fastdata._roles import check_role
from fastdata._transfer import copy_to_device
from fastdata.datasets import ResumableDataLoader
from fastdata.decode._base import Decoder, batch_item
from fastdata.decode.cpu import CpuDecoder
from fastdata.errors import DecodeError

LAST_BATCH = ("partial", "drop", "pad")


def _to_device(field: Any, device: torch.device) -> Any:
    if isinstance(field, torch.Tensor) and field.device.type == "cpu":
        return copy_to_device(field, device)  # pinned first on CUDA: the host never waits
    if isinstance(field, torch.Tensor):
        return field.to(device, non_blocking=True)
    return field


def _split(batch: Any, position: int) -> tuple[Sequence[Any], list[Any]]:
    if not isinstance(batch, list | tuple) or not batch:
        raise TypeError(
            f"batch {position} must be a tuple (encoded_images, *fields), "
            f"got {type(batch).__name__}"
        )
    encoded, *fields = batch
    return encoded, fields


def _field_roles(batches: Iterable[Any], roles: Sequence[str] | None) -> dict[str, str]:
    """Name → role of the fields after the encoded images: ``roles`` (named by position,
    ``"field 1"``...), else those of the fastdata dataset a DataLoader reads."""
    if roles is not None:
        if isinstance(roles, str):
            raise TypeError(f"roles must be a sequence of role names, got {roles!r}")
        return {f"field {i + 1}": check_role(role) for i, role in enumerate(roles)}
    dataset = getattr(batches, "dataset", None)  # a ShardDataset or RAMDataset has roles
    dataset_roles, fields = getattr(dataset, "roles", None), getattr(dataset, "fields", None)
    if not isinstance(dataset_roles, dict) or not isinstance(fields, tuple):
        return {}
    return {name: dataset_roles[name] for name in fields[1:]}


class _WorkerBatch(NamedTuple):
    """A batch decoded in a DataLoader worker: images, fields indexed alike, the number of
    samples read, and the decode errors, for the main process's ``on_error``."""

    images: torch.Tensor
    fields: list[Any]
    size: int
    errors: list[DecodeError]


class _DecodeInWorkers:
    """``collate_fn`` that collates as the loader did, then decodes with a one-thread
    :class:`CpuDecoder` of the same settings, built once per worker process."""

    def __init__(self, collate: Callable[[Any], Any], decoder: CpuDecoder) -> None:
        self.collate = collate
        self.settings = {
            "size": decoder.size,
            "random_crop": decoder.random_crop,
            "grayscale": decoder.grayscale,
            "max_pixels": decoder.max_pixels,
        }
        # The main process's crop draws seed the workers' (mixed with each worker's seed,
        # which DataLoader draws afresh each epoch from torch's generator). The collate sees
        # encoded bytes, not indices or epochs, so the per-sample (seed, epoch, index) keying
        # of the datasets' transforms cannot apply here.
        self.seed = decoder.derive_seed()
        self.keep_damaged = decoder.keep_damaged  # reported as kept by this process's policy
        self._decoder: CpuDecoder | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoder": None, "_pid": -1}

    def _worker_decoder(self) -> CpuDecoder:
        if self._decoder is None or self._pid != os.getpid():
            info = get_worker_info()
            worker_seed = info.seed if info is not None else 0
            decoder = CpuDecoder(
                **self.settings,  # type: ignore[arg-type]
                on_error="skip",
                num_threads=1,
                seed=(self.seed + worker_seed) % 2**62,
            )
            decoder.keep_damaged = self.keep_damaged
            self._decoder, self._pid = decoder, os.getpid()
        return self._decoder

    def __call__(self, samples: Any) -> _WorkerBatch:
        encoded, fields = _split(self.collate(samples), 0)
        decoder = self._worker_decoder()
        decoded = decode_batch(decoder, EncodedBatch(encoded, fields))
        return _WorkerBatch(decoded.images, decoded.fields, decoded.total, decoder.last_errors)


def _item_indices(source: Iterable[Any], count: int) -> list[int] | None:
    """The dataset indices of the ``count`` samples of the batch ``source`` handed out
    last, when it is a ``ResumableDataLoader`` that knows them (else ``None``)."""
    if not isinstance(source, ResumableDataLoader):
        return None
    indices = source.last_batch_indices()
    if indices is None or len(indices) != count:  # the dataset left samples out
        return None
    return indices


def _item_sources(source: Iterable[Any], count: int) -> list[str] | None:
    """How decode errors name the ``count`` samples of the batch ``source`` handed out
    last: ``"dataset[i] (batch item k)"`` where :func:`_item_indices` knows them
    (``None``: they keep the decoder's ``"batch item k"``)."""
    indices = _item_indices(source, count)
    if indices is None:
        return None
    return [f"dataset[{index}] (batch item {item})" for item, index in enumerate(indices)]


def _item_keys(source: Iterable[Any], count: int) -> tuple[int, list[int]] | None:
    """``(epoch, dataset indices)`` of the batch ``source`` handed out last, which key
    its crop draws, where :func:`_item_indices` knows them (``None``: the decoder's
    stream)."""
    indices = _item_indices(source, count)
    epoch = source.epoch if isinstance(source, ResumableDataLoader) else None
    return None if indices is None or epoch is None else (epoch, indices)


def _named(error: DecodeError, sources: list[str] | None) -> DecodeError:
    """``error`` of a worker's decoder (which names ``"batch item k"``) named as
    ``sources[k]``."""
    if sources is None:
        return error
    by_item = {batch_item(item): name for item, name in enumerate(sources)}
    name = by_item.get(error.source)
    return error if name is None else error.with_source(name)


def _with_collate(loader: DataLoader[Any], collate: Callable[[Any], Any]) -> DataLoader[Any]:
    """A DataLoader like ``loader`` (same dataset, sampler objects and worker settings)
    whose workers run ``collate``; a ResumableDataLoader for one (its state is exact)."""
    options: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": collate,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
    }
    if getattr(loader, "pin_memory_device", ""):
        options["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        options["in_order"] = loader.in_order
    if isinstance(loader.dataset, IterableDataset):
        options.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        options["batch_sampler"] = loader.batch_sampler
    else:
        options.update(sampler=loader.sampler, batch_size=None)
    kind = ResumableDataLoader if isinstance(loader, ResumableDataLoader) else DataLoader
    return kind(loader.dataset, **options)


class DecodingLoader:
    """Wraps an iterable of encoded batches and yields decoded ``(images, *fields)`` batches.

    For a fastdata dataset, the decoder can be the dataset's own instead:
    ``ShardDataset(path, decode=decoder).loader(...)`` (or ``RAMDataset``) decodes each
    batch in this process after its workers with the same step this loader runs (the same
    batches for the same decoder settings, ``on_error`` the dataset's). This loader adds
    ``last_batch``, moves the fields to the decoder's device, and takes any iterable.

    Each input batch is ``(encoded, *fields)``: ``encoded`` a list of B encoded images
    (1-D uint8 tensors, arrays or bytes), e.g. what ``ShardDataset(decode=False)`` and
    ``RAMDataset`` of file bytes give through a pass-through collate; ``fields`` anything
    with one entry per sample (``(B,)`` int64 labels, ``(B, H, W)`` masks, lists), which
    follow the images: samples dropped by ``on_error`` are dropped from them too (when
    none is dropped, the fields are passed on as they are, pinned memory included), and
    tensors are moved to the decoder's device. Fields are not cropped or resized, so a
    field whose role a geometric transform moves (``mask``, ``boxes``: see
    :func:`~fastdata.transforms.moved_roles`) is refused when the loader is made: its
    pixels or coordinates would no longer match the decoded images. The roles are read
    from the fastdata dataset under a ``DataLoader`` (``dataset.roles``), or given as
    ``roles``; fields of other iterables, given no roles, pass as ``other``.

    With the ``cpu`` decoder and a ``torch.utils.data.DataLoader`` with ``num_workers >
    0``, the batches are decoded in the workers: an equivalent DataLoader (same dataset,
    sampler objects and worker options) is built whose ``collate_fn`` collates as the
    original did and then decodes with one thread per worker, seeded from the decoder's
    seed and each worker's seed. ``on_error`` still applies in this process. Elsewhere
    (GPU decoders, no workers, ``decode_in_workers=False``, other iterables) the batches
    are decoded here.

    Random crops of a seeded decoder: decoded here from a
    :class:`~fastdata.datasets.ResumableDataLoader` (``dataset.loader(...)``), which says
    each batch's epoch and dataset indices, each sample's crop is drawn from ``(seed,
    epoch, index)`` alone, as the dataset's own ``decode=`` path and the batch transforms
    draw: a resumed run, another ``num_workers`` or batch size gets the same crops. Over
    other iterables they follow the decoder's seed in batch order (a rerun repeats them;
    a resumed run does not). Decoded in the workers, the ``collate_fn`` sees encoded bytes
    but no indices: the crops follow the worker seeds, which the DataLoader draws from
    torch's generator each epoch (a rerun with a seeded generator repeats them; a resumed
    run or another ``num_workers`` does not). For crops that survive a resume with the
    ``cpu`` decoder and workers, give it to the dataset (``decode=decoder``), whose
    workers decode each sample into its keyed crop.

    Args:
        batches: Any iterable of such batches, typically a ``torch.utils.data.DataLoader``.
        decoder: From :func:`fastdata.decode.create_decoder`.
        last_batch: What to do with a batch holding fewer than ``batch_size`` samples (the
            last one, and any that lost samples to ``on_error="skip"|"warn"``):
            ``"partial"`` yields it as is, ``"drop"`` leaves it out, ``"pad"`` repeats its
            samples (cyclically) up to ``batch_size``. A batch in which no sample decoded
            is always left out.
        batch_size: The full batch size; by default the size of the first batch read.
        decode_in_workers: Decode in the DataLoader's workers when the decoder is the
            ``cpu`` one and there are workers (default); ``False``: always decode in this
            process.
        roles: The role of each field after the encoded images, in order (default: the
            roles of the fastdata dataset under ``batches``, if any).

    Raises:
        ValueError: A field's role is one the decoder's resize and crop would leave
            misaligned (``mask``, ``boxes``), or ``roles`` names an unknown role.

    Yields:
        batch (tuple): ``(images, *fields)``, images ``(K, C, H, W)`` uint8 on the decoder's
            device (channels_last), fields indexed alike.

    Errors: over a :class:`~fastdata.datasets.ResumableDataLoader` (``dataset.loader(...)``),
    a :class:`~fastdata.DecodeError` (raised, or in the ``on_error="warn"`` warning) names
    the sample's dataset index, ``dataset[123] (batch item 7)``, decoding in workers or
    not; over other iterables (or a batch the dataset left samples out of), the batch item.

    Resuming: over a :class:`~fastdata.datasets.ResumableDataLoader` (``dataset.loader(...)``),
    :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch exactly, workers or not:
    the batches read ahead and not yet yielded are not counted as consumed (the inner
    loader's and the sampler's ``state_dict()`` agree); the samples are those of the
    uninterrupted run, and so are their crops where they are keyed (see above).
    """

    def __init__(
        self,
        batches: Iterable[Sequence[Any]],
        decoder: Decoder,
        *,
        last_batch: str = "partial",
        batch_size: int | None = None,
        decode_in_workers: bool = True,
        roles: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must come from create_decoder, got {type(decoder).__name__}")
        self.roles = _field_roles(batches, roles)
        refuse_moved_fields(self.roles, decoder)
        if last_batch not in LAST_BATCH:
            raise ValueError(f"last_batch must be one of {LAST_BATCH}, got {last_batch!r}")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        self.batches = batches
        self.decoder = decoder
        self.last_batch = last_batch
        self.batch_size = batch_size
        self.decodes_in_workers = (
            bool(decode_in_workers)
            and isinstance(decoder, CpuDecoder)
            and isinstance(batches, DataLoader)
            and batches.num_workers > 0
        )
        self._worker_loader: DataLoader[Any] | None = None

    def __len__(self) -> int:
        """Number of input batches (an upper bound under ``last_batch="drop"``)."""
        return len(self.batches)  # type: ignore[arg-type]

    def _resumable(self, method: str) -> ResumableDataLoader:
        source = self._source()
        if not isinstance(source, ResumableDataLoader):
            raise TypeError(
                f"DecodingLoader.{method}() needs batches from a fastdata ResumableDataLoader "
                f"(dataset.loader(...)), got {type(self.batches).__name__}"
            )
        return source

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is in the epoch: the input loader's state, less the batches read
        ahead and not yet yielded (see
        :meth:`~fastdata.datasets.ResumableDataLoader.state_dict`).

        Raises:
            TypeError: The input is not a ``ResumableDataLoader``.
        """
        return self._resumable("state_dict").state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the batches of the epoch not yet yielded.

        Raises:
            TypeError: The input is not a ``ResumableDataLoader``, or ``state`` is not one
                of its states.
            ValueError: Its sampler refuses ``state``.
        """
        self._resumable("load_state_dict").load_state_dict(state)

    def _source(self) -> Iterable[Any]:
        if not self.decodes_in_workers:
            return self.batches
        if self._worker_loader is None:  # built once: persistent workers stay alive
            loader = self.batches
            assert isinstance(loader, DataLoader) and isinstance(self.decoder, CpuDecoder)
            collate = _DecodeInWorkers(loader.collate_fn, self.decoder)
            self._worker_loader = _with_collate(loader, collate)
        return self._worker_loader

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        full = [self.batch_size]  # the full batch size, once known (this pass only)
        source = self._source()
        batches = iter(source)
        if self.decodes_in_workers:
            for batch in batches:
                if not isinstance(batch, _WorkerBatch):
                    raise TypeError(f"expected a batch decoded in a worker, got {type(batch)}")
                sources = _item_sources(source, batch.size)
                for error in batch.errors:
                    self.decoder.on_error.handle(_named(error, sources), stacklevel=2)
                images = _to_device(batch.images, self.decoder.device)
                yield from self._finish(images, batch.fields, batch.size, full)
            return

        # The next batch may be read (and its decoding started) before this one is handed
        # out: a batch read ahead is not consumed.
        def encoded_batches() -> Iterator[EncodedBatch]:
            for position, batch in enumerate(batches):
                encoded, fields = _split(batch, position)
                count = len(encoded)
                sources, keys = _item_sources(source, count), _item_keys(source, count)
                yield EncodedBatch(encoded, fields, sources, keys)

        decoded = DecodedBatches(self.decoder, encoded_batches())
        if isinstance(source, ResumableDataLoader):
            source.hold_back(decoded.read_ahead_count())
        for images, fields, total in decoded:
            yield from self._finish(images, fields, total, full)

    def _finish(
        self, images: torch.Tensor, fields: list[Any], total: int, full: list[int | None]
    ) -> Iterator[tuple[Any, ...]]:
        """Apply ``last_batch`` to one decoded batch and move its fields to the device."""
        batch_size = full[0] if full[0] is not None else total
        full[0] = batch_size
        count = int(images.shape[0])
        if count < batch_size:
            if self.last_batch == "drop" or count == 0:
                return
            if self.last_batch == "pad":
                repeat = torch.arange(batch_size) % count
                images = images.index_select(0, copy_to_device(repeat, images.device))
                images = images.contiguous(memory_format=torch.channels_last)
                fields = [take_rows(field, repeat, i + 1) for i, field in enumerate(fields)]
        out = [_to_device(field, self.decoder.device) for field in fields]
        yield (images, *out)

"""Decode batches of encoded images in the main process, as they come out of a DataLoader.

CUDA cannot run in forked DataLoader workers, so workers only read encoded bytes (cheap)
and the main process decodes each batch on the device (nvJPEG, DALI) or on its threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from fastdata.decode._base import Decoder

LAST_BATCH = ("partial", "drop", "pad")


def _take(field: Any, kept: torch.Tensor, position: int) -> Any:
    """The rows ``kept`` of a per-sample field (tensor, or list/tuple of per-sample items)."""
    if isinstance(field, torch.Tensor):
        return field.index_select(0, kept.to(field.device))
    if isinstance(field, list | tuple):
        return [field[i] for i in kept.tolist()]
    raise TypeError(
        f"batch element {position} must be a tensor or a list with one entry per sample, "
        f"got {type(field).__name__}"
    )


def _to_device(field: Any, device: torch.device) -> Any:
    if isinstance(field, torch.Tensor):
        return field.to(device, non_blocking=True)
    return field


class DecodingLoader:
    """Wraps an iterable of encoded batches and yields decoded ``(images, *fields)`` batches.

    Each input batch is ``(encoded, *fields)``: ``encoded`` a list of B encoded images
    (1-D uint8 tensors, arrays or bytes), e.g. what ``ShardDataset(decode=False)`` and
    ``RAMDataset`` of file bytes give through a pass-through collate; ``fields`` anything
    with one entry per sample (``(B,)`` int64 labels, ``(B, H, W)`` masks, lists), which
    follow the images: samples dropped by ``on_error`` are dropped from them too, and
    tensors are moved to the decoder's device. Fields are not cropped or resized: masks
    must already match the decoded images' geometry.

    Args:
        batches: Any iterable of such batches, typically a ``torch.utils.data.DataLoader``.
        decoder: From :func:`fastdata.decode.create_decoder`.
        last_batch: What to do with a batch holding fewer than ``batch_size`` samples (the
            last one, and any that lost samples to ``on_error="skip"|"warn"``):
            ``"partial"`` yields it as is, ``"drop"`` leaves it out, ``"pad"`` repeats its
            samples (cyclically) up to ``batch_size``. A batch in which no sample decoded
            is always left out.
        batch_size: The full batch size; by default the size of the first batch read.

    Yields:
        batch (tuple): ``(images, *fields)``, images ``(K, C, H, W)`` uint8 on the decoder's
            device (channels_last), fields indexed alike.
    """

    def __init__(
        self,
        batches: Iterable[Sequence[Any]],
        decoder: Decoder,
        *,
        last_batch: str = "partial",
        batch_size: int | None = None,
    ) -> None:
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must come from create_decoder, got {type(decoder).__name__}")
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

    def __len__(self) -> int:
        """Number of input batches (an upper bound under ``last_batch="drop"``)."""
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        batch_size = self.batch_size
        for position, batch in enumerate(self.batches):
            if not isinstance(batch, list | tuple) or not batch:
                raise TypeError(
                    f"batch {position} must be a tuple (encoded_images, *fields), "
                    f"got {type(batch).__name__}"
                )
            encoded, *fields = batch
            if batch_size is None:
                batch_size = len(encoded)
            decoded = self.decoder.decode(encoded)
            kept = decoded.kept
            count = int(kept.numel())
            if count < batch_size:
                if self.last_batch == "drop" or count == 0:
                    continue
                if self.last_batch == "pad":
                    repeat = torch.arange(batch_size) % count
                    kept = kept[repeat]
                    images = decoded.images[repeat.to(decoded.images.device)].contiguous(
                        memory_format=torch.channels_last
                    )
                else:
                    images = decoded.images
            else:
                images = decoded.images
            out = [
                _to_device(_take(field, kept, i + 1), self.decoder.device)
                for i, field in enumerate(fields)
            ]
            yield (images, *out)

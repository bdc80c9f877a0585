"""The ``dali`` backend: an NVIDIA DALI pipeline fed batch by batch.

``fn.external_source`` receives the encoded bytes and each image's crop box (computed by
the same geometry as the other backends, so a seed gives the same crops everywhere);
``fn.decoders.image_slice`` decodes only that region (``device="mixed"`` on a GPU: nvJPEG;
CPU-only with ``device_id=None``) and ``fn.resize`` brings it to the output size.

A DALI batch fails whole when one image is bad, so a failed batch is retried image by image
through a one-sample pipeline; a pipeline that failed is dropped and rebuilt when next
needed (an error can leave it unusable), so a bad image costs a rebuild of the one-sample
pipeline, and the batch pipeline is rebuilt at most once per failed batch. Images that
are not 1- or 3-component JPEGs (PNG, CMYK) and images DALI cannot decode go through the
CPU decoder (counted in ``decoder.fallbacks``, warned about at 1, 10, 100, ...); what
neither can decode is handled by ``on_error``. Environment errors (CUDA out of memory)
are raised.

Threads: ``num_threads`` defaults to the CPUs this process may use divided by the ranks
on this machine (``LOCAL_WORLD_SIZE``, set by ``torchrun``).

On a GPU the pipeline runs on the caller's current CUDA stream: ``run(stream)`` returns
outputs ordered on it and the copy into the output tensor is queued on it, so the host
does not wait for the GPU part of decoding.

Scheduling ahead: :meth:`DaliDecoder.decode_stream` (what :class:`DecodingLoader` uses)
runs a second pipeline with two iterations in flight: batch ``i + 1`` is fed and scheduled
before batch ``i``'s outputs are taken, so DALI decodes it while the caller works on batch
``i``. A batch with images DALI does not take (PNG, CMYK), or larger than the pipeline,
drains the queue and is decoded alone; a batch that fails takes the pipeline down with the
batch queued behind it, and both are decoded alone (image by image where needed). Leaving
a stream early drops the look-ahead pipeline (outputs were scheduled that nobody
collects): the next stream builds a new one.

EXIF orientation: a JPEG's orientation tag is applied (``adjust_orientation=True``), the
rule of the other backends, and crop boxes are drawn on the image as displayed (DALI takes
the slice in displayed coordinates and maps it to the stored pixels before decoding).

Forked children: a pipeline held when a process forks (a DataLoader worker, a
preprocessing worker) is kept, never destroyed, in the child, whose copy has none of the
pipeline's threads for its destructor to join (:mod:`fastdata.decode._dali_fork`).

Truncated JPEGs: the CPU-only pipeline reports them as errors, like the ``cpu`` backend;
the mixed (nvJPEG) decoder may decode them without an error, the missing rows left flat.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from fastdata._codec import DEFAULT_MAX_PIXELS, jpeg_header
from fastdata._optional import import_optional
from fastdata._transfer import copy_to_device
from fastdata.decode._base import (
    DecodedBatch,
    Decoder,
    channels_last,
    item_source,
    resolve_num_threads,
)
from fastdata.decode._batching import decode_batch_or_each, is_environment_error
from fastdata.decode._dali_fork import track
from fastdata.decode._geometry import Box, crop_boxes
from fastdata.decode.cpu import decode_crop
from fastdata.errors import DecodeError, OnError
from fastdata.gpu.prefetch import resolve_device
from fastdata.ops import Executor, RandomResizedCrop

_ACCELERATED_COMPONENTS = (1, 3)
_PURPOSE = "The dali decoder backend"


def _build_pipeline(
    max_batch_size: int,
    num_threads: int,
    device_id: int | None,
    out_hw: tuple[int, int],
    grayscale: bool,
    *,
    depth: int = 1,
) -> Any:
    """A built DALI pipeline with inputs ``jpegs``, ``anchor`` (x, y) and ``shape`` (w, h),
    ``depth`` iterations in flight (2: the next batch runs while this one is collected)."""
    dali = import_optional("nvidia.dali", _PURPOSE)
    fn, types = dali.fn, dali.types
    pipeline = dali.Pipeline(
        batch_size=max_batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=depth,
    )
    with pipeline:
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
        images = fn.decoders.image_slice(
            jpegs,
            anchor,
            shape,
            device="cpu" if device_id is None else "mixed",
            output_type=types.GRAY if grayscale else types.RGB,
            normalized_anchor=False,
            normalized_shape=False,
            # EXIF orientation applied, like the other backends; the slice (anchor, shape)
            # is in the coordinates of the image as displayed (DALI maps it back)
            adjust_orientation=True,
        )
        images = fn.resize(images, resize_x=out_hw[1], resize_y=out_hw[0], antialias=True)
        pipeline.set_outputs(images)
    pipeline.build()
    return track(pipeline)  # never destroyed in a forked child (see _dali_fork)


class _Plan(NamedTuple):
    """One batch ready for DALI: its buffers, crop draws, the indices DALI takes and their
    ``(bytes, box)`` items."""

    buffers: list[np.ndarray]
    draws: np.ndarray
    accelerated: list[int]
    items: list[tuple[np.ndarray, Box]]


class DaliDecoder(Decoder):
    """Decode with an NVIDIA DALI pipeline; see :func:`fastdata.decode.create_decoder`.

    Args:
        size: Output ``(height, width)``, or an int for a square.
        random_crop: The random resized crop to run (training; see :class:`Decoder`), or
            ``None`` for a centred crop.
        device: ``"cpu"`` runs DALI's CPU operators only (``device_id=None``); a CUDA
            device decodes with DALI's mixed (nvJPEG) decoder on it.
        on_error: As for :class:`~fastdata.decode.Decoder` (see
            :class:`~fastdata.errors.OnError`).
        grayscale: Decode to one channel.
        num_threads: DALI CPU threads (default: the CPUs this process may use).
        seed: Seed of the random crops.
        max_batch_size: Initial pipeline batch size; it grows if a larger batch comes.
        max_pixels: As for :class:`~fastdata.decode.Decoder`.
    """

    backend = "dali"

    def __init__(
        self,
        size: int | tuple[int, int],
        *,
        random_crop: RandomResizedCrop | Executor | bool | None = None,
        device: torch.device | str = "cpu",
        on_error: OnError | str = "raise",
        grayscale: bool = False,
        num_threads: int | None = None,
        seed: int | None = None,
        max_batch_size: int = 256,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        target = torch.device(device)
        if target.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be the CPU or a CUDA device, got {str(target)!r}")
        if target.type == "cuda":
            target = resolve_device(target)  # a bare "cuda": see resolve_device (DDP)
        super().__init__(
            size,
            random_crop=random_crop,
            device=target,
            on_error=on_error,
            grayscale=grayscale,
            seed=seed,
            max_pixels=max_pixels,
        )
        self.num_threads = resolve_num_threads(num_threads)
        import_optional("nvidia.dali", _PURPOSE)  # fail now, with the pip command
        self._max_batch_size = max_batch_size
        self._pipeline: Any = None
        self._single: Any = None  # one-sample pipeline: lone retries of a failed batch
        # decode_stream's pipeline (two iterations in flight) and whether its first
        # schedule_run (which prefetches both) has happened.
        self._ahead: Any = None
        self._ahead_size = 0
        self._ahead_started = False

    def _build(self, max_batch_size: int) -> Any:
        return _build_pipeline(
            max_batch_size,
            self.num_threads,
            self.device.index if self.device.type == "cuda" else None,
            self.size,
            self.grayscale,
        )

    def _pipeline_for(self, count: int) -> Any:
        if self._pipeline is None or count > self._max_batch_size:
            self._max_batch_size = max(count, self._max_batch_size)
            self._pipeline = self._build(self._max_batch_size)
        return self._pipeline

    def _run(self, items: list[tuple[np.ndarray, Box]]) -> torch.Tensor:
        """Run the batch pipeline on ``(bytes, box)`` pairs: ``(K, H, W, C)`` uint8 on the
        device. A failed run drops the pipeline, so the next run builds a fresh one."""
        try:
            return self._run_pipeline(self._pipeline_for(len(items)), items)
        except Exception:
            self._pipeline = None
            raise

    def _run_one(self, item: tuple[np.ndarray, Box]) -> torch.Tensor:
        """One image through the one-sample pipeline (dropped if it fails): ``(H, W, C)``."""
        if self._single is None:
            self._single = self._build(1)
        try:
            return self._run_pipeline(self._single, [item])[0]
        except Exception:
            self._single = None
            raise

    @staticmethod
    def _feed(pipeline: Any, items: list[tuple[np.ndarray, Box]]) -> None:
        pipeline.feed_input("jpegs", [data for data, _ in items])
        pipeline.feed_input("anchor", [np.array([b.left, b.top], np.float32) for _, b in items])
        pipeline.feed_input("shape", [np.array([b.width, b.height], np.float32) for _, b in items])

    def _run_pipeline(self, pipeline: Any, items: list[tuple[np.ndarray, Box]]) -> torch.Tensor:
        self._feed(pipeline, items)
        if self.device.type == "cpu":
            (output,) = pipeline.run()
            return torch.from_numpy(output.as_array())
        # Outputs ordered on the caller's stream, and the copy queued there: no host sync.
        stream = torch.cuda.current_stream(self.device)
        (output,) = pipeline.run(stream)
        return self._to_device(output, stream)

    def _to_device(self, output: Any, stream: Any) -> torch.Tensor:
        """A GPU pipeline output copied into a new tensor on ``stream`` (no host sync)."""
        plugin = import_optional("nvidia.dali.plugin.pytorch", _PURPOSE)
        dense = output.as_tensor()
        target = torch.empty(dense.shape(), dtype=torch.uint8, device=self.device)
        plugin.feed_ndarray(dense, target, cuda_stream=stream)
        return target

    def _collect_ahead(self) -> torch.Tensor:
        """The oldest scheduled batch of the look-ahead pipeline: ``(K, H, W, C)`` uint8."""
        if self.device.type == "cpu":
            (output,) = self._ahead.outputs()
            return torch.from_numpy(output.as_array())
        stream = torch.cuda.current_stream(self.device)
        (output,) = self._ahead.outputs(stream)
        return self._to_device(output, stream)

    def _on_batch_failure(self, error: Exception) -> None:
        self.count_fallback(
            "batch_retry",
            f"a batch failed in DALI ({error}); it is decoded image by image, and images "
            "DALI cannot decode go to the CPU decoder (much slower)",
        )

    def _plan(self, buffers: list[np.ndarray]) -> _Plan:
        """Plan a checked batch (which keeps the sources its errors name)."""
        draws = self._draws(buffers)
        headers = [jpeg_header(buf) for buf in buffers]
        accelerated = [
            i for i, h in enumerate(headers) if h is not None and h[2] in _ACCELERATED_COMPONENTS
        ]
        # crop boxes are drawn on the image as displayed (EXIF orientation applied)
        sizes = [headers[i].oriented_hw for i in accelerated]  # type: ignore[union-attr]
        boxes = crop_boxes(sizes, self.size, self.random_crop, draws[accelerated]).tolist()
        items = [(buffers[i], Box(*box)) for i, box in zip(accelerated, boxes, strict=True)]
        return _Plan(buffers, draws, accelerated, items)

    def _decode(self, buffers: list[np.ndarray]) -> DecodedBatch:
        return self._decode_planned(self._plan(buffers))

    def _decode_stream(self, batches: Iterable[list[np.ndarray]]) -> Iterator[DecodedBatch]:
        """Decode ``batches`` in order with batch ``i + 1`` in flight while batch ``i`` is
        collected (see the module docstring); same results as :meth:`decode` per batch."""
        queue: deque[_Plan] = deque()
        try:
            for encoded in batches:
                plan = self._plan(encoded)
                streamable = plan.items and len(plan.accelerated) == len(plan.buffers)
                if not streamable:
                    yield from self._drain(queue)
                    yield self._decode_planned(plan)
                    continue
                if self._ahead is not None and len(plan.items) > self._ahead_size:
                    yield from self._drain(queue)
                    self._ahead = None  # rebuilt below, large enough
                if self._ahead is None:
                    self._ahead_size = max(len(plan.items), self._max_batch_size)
                    self._ahead = _build_pipeline(
                        self._ahead_size,
                        self.num_threads,
                        self.device.index if self.device.type == "cuda" else None,
                        self.size,
                        self.grayscale,
                        depth=2,
                    )
                    self._ahead_started = False
                self._feed(self._ahead, plan.items)
                queue.append(plan)
                if self._ahead_started:
                    self._ahead.schedule_run()
                elif len(queue) == 2:
                    self._ahead.schedule_run()  # the first call runs both fed batches
                    self._ahead_started = True
                if len(queue) == 2:
                    yield from self._collect(queue)
            yield from self._drain(queue)
        finally:
            if queue:  # left early: scheduled outputs nobody will collect
                self._ahead = None

    def _collect(self, queue: deque[_Plan]) -> list[DecodedBatch]:
        """The oldest queued batch. If DALI fails on it, the pipeline is dropped along with
        the batches queued behind it, and they are all decoded alone (in order)."""
        plan = queue[0]
        try:
            dense = self._collect_ahead()
        except Exception as error:
            self._ahead = None
            if is_environment_error(error):
                raise
            self._on_batch_failure(error)
            retried = list(queue)
            queue.clear()
            return [self._decode_planned(p) for p in retried]
        queue.popleft()
        return [DecodedBatch(channels_last(dense), torch.arange(len(plan.buffers)))]

    def _drain(self, queue: deque[_Plan]) -> Iterator[DecodedBatch]:
        """Collect every queued batch (a lone fed batch never scheduled runs on its own)."""
        if queue and not self._ahead_started:
            self._ahead = None  # one fed batch and no schedule_run: decode it alone
            yield self._decode_planned(queue.popleft())
        while queue:
            yield from self._collect(queue)

    def _decode_planned(self, plan: _Plan) -> DecodedBatch:
        buffers, draws, accelerated, items = plan
        dense: list[torch.Tensor] = []

        def run_batch(batch: list[tuple[np.ndarray, Box]]) -> list[torch.Tensor]:
            dense.append(self._run(batch))
            return list(dense[0].unbind(0))

        if len(accelerated) < len(buffers):
            self.count_fallback(
                "cpu_decode",
                f"{len(buffers) - len(accelerated)} of {len(buffers)} images in a batch are "
                "not 1- or 3-component JPEGs (PNG, CMYK, ...) and go to the CPU decoder",
                len(buffers) - len(accelerated),
            )
        results = decode_batch_or_each(
            items,
            run_batch,
            self._run_one,
            on_batch_failure=self._on_batch_failure,
        )
        if dense and len(accelerated) == len(buffers):  # the common case: no copy at all
            kept_all = torch.arange(len(buffers), dtype=torch.int64)
            return DecodedBatch(channels_last(dense[0]), kept_all)
        decoded = dict(zip(accelerated, results, strict=True))
        images: list[torch.Tensor] = []
        kept: list[int] = []
        for index, data in enumerate(buffers):
            result = decoded.get(index)
            try:
                if isinstance(result, torch.Tensor):
                    images.append(result)
                else:
                    if index in decoded:
                        self.count_fallback(
                            "cpu_decode",
                            f"DALI could not decode {item_source(buffers, index)} ({result}); "
                            "it goes to the CPU decoder",
                        )
                    pixels = decode_crop(
                        data,
                        self.size,
                        self.random_crop,
                        draws[index],
                        grayscale=self.grayscale,
                        source=item_source(buffers, index),
                        max_pixels=self.max_pixels,
                    )
                    images.append(copy_to_device(torch.from_numpy(pixels), self.device))
            except DecodeError as error:
                self.on_error.handle(error, stacklevel=2)
                continue
            kept.append(index)
        if images:
            batch = torch.stack(images)
        else:
            batch = torch.empty(
                (0, *self.size, self.channels), dtype=torch.uint8, device=self.device
            )
        return DecodedBatch(channels_last(batch), torch.tensor(kept, dtype=torch.int64))

    def close(self) -> None:
        """Release the DALI pipelines."""
        self._pipeline = None
        self._single = None
        self._ahead = None

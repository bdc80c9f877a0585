"""What ShardDataset and RAMDataset share: batched reads, decoding, transforms, threads."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from fastdata._codec import DEFAULT_MAX_PIXELS, decode_image
from fastdata._draws import batch_draws
from fastdata._fields import FieldBatch, Geometry, apply_geometry
from fastdata._images import check_masks, stack_images
from fastdata._roles import check_role
from fastdata._system import available_memory_bytes, usable_cpus
from fastdata._threads import parallel_for
from fastdata.datasets._batch_decode import batch_decode_for
from fastdata.datasets._buffers import BatchBuffers
from fastdata.datasets._collate import RAGGED_MODES, RaggedCollate, mark_collated, pack_for_transfer
from fastdata.datasets._decoding import (
    PlannedCrop,
    as_buffer,
    decode_into_center,
    decode_into_crop,
    plan_crops,
)
from fastdata.datasets._loader import ResumableDataLoader
from fastdata.datasets._memory import MemoryReport
from fastdata.datasets._options import ReadOptions, check_num_threads
from fastdata.datasets._plan import TransformPlan, plan_transform
from fastdata.datasets._store import RAMStore, Store
from fastdata.errors import DecodeError, OnError
from fastdata.shards import FieldSpec
from fastdata.transforms import BatchTransform

# Where a batch's values hold the crops a leading IoU crop cut in the decode, until the
# boxes follow them (never returned).
_DECODED_CROPS = "\x00decoded_crops"


class BatchedDataset(Dataset):
    """A map-style dataset over a :class:`Store` whose ``__getitems__`` returns whole batches.

    See :class:`~fastdata.datasets.ShardDataset` for the arguments.
    """

    # Images whose header claims more pixels are refused before decoding (None: no limit).
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __init__(
        self,
        store: Store,
        *,
        fields: Sequence[str],
        transform: Callable[..., Any] | None,
        options: ReadOptions,
    ) -> None:
        _override_roles(store, fields, options.roles)
        decodes, crop_decode = options.decodes, options.crop_decode
        self.options = options
        self.store = store
        self.fields = tuple(fields)
        self.layout = options.layout
        self.decode = decodes
        # A Decoder's geometry: each image decoded into its output size and crop.
        self.crop_decode = crop_decode
        self.on_error = OnError.parse(options.on_error)
        self.max_pixels = options.max_pixels
        # Everything later reads the transform's declarations from here.
        self.plan: TransformPlan = plan_transform(
            transform,
            store.specs,
            self.fields,
            decode=decodes,
            decode_min_side=options.decode_min_side,
            decoded_size=None if crop_decode is None else crop_decode.size,
        )
        # A decoder run on whole batches in the training process (nvjpeg, dali, ...).
        self.batch_decode = batch_decode_for(
            options.decode,
            fields=self.fields,
            specs=store.specs,
            transform=transform,
            decode_min_side=options.decode_min_side,
            layout=self.layout,
            policy=self.on_error,
            source=store.source,
        )
        # Per batch: each field read (and decoded, or transformed) into its own buffer,
        # plus the transform's output.
        self._buffers = BatchBuffers(2 * len(self.fields) + 1)
        self._num_threads: int | None = None
        self.num_threads = options.num_threads
        self._executor: ThreadPoolExecutor | None = None
        self._executor_key: tuple[int, int] = (-1, 0)

    @property
    def transform(self) -> Callable[..., Any] | None:
        """The transform (fixed at construction), applied to the fields by their roles."""
        return self.plan.transform

    @property
    def roles(self) -> dict[str, str]:
        """The role of each returned field (``image``, ``mask``, ``boxes``, ``label``,
        ``box_labels``, ``path``, ``other``), as the manifest declares it or the
        dataset's ``roles`` argument overrides it."""
        return {name: self.store.specs[name].role for name in self.fields}

    @property
    def mask_fields(self) -> tuple[str, ...]:
        """Fields the batch transform moves along with the image (role ``mask``)."""
        return self.plan.mask_fields

    @property
    def decode_min_side(self) -> int | None:
        """JPEGs decode reduced down to this shorter side (``None``: full size)."""
        return self.plan.decode_min_side

    # -- threads ------------------------------------------------------------------------
    @property
    def num_threads(self) -> int:
        """Threads ``__getitems__`` uses in the calling process (settable).

        Unset (``None``), it is :func:`~fastdata._system.usable_cpus` in the main process
        and 1 inside DataLoader workers. With ``num_workers=0`` the threads do the per-sample
        copies, decodes and augmentations of each batch in the training process, which for
        raw uint8 pixels is faster than shipping batches from worker processes.
        """
        if self._num_threads is not None:
            return self._num_threads
        return 1 if get_worker_info() is not None else usable_cpus()

    @num_threads.setter
    def num_threads(self, value: int | None) -> None:
        self._num_threads = check_num_threads(value)

    def _pool(self) -> tuple[Executor | None, int]:
        threads = self.num_threads
        if threads <= 1:
            return None, 1
        if self._executor is None or self._executor_key != (os.getpid(), threads):
            # The calling thread takes one slice itself.
            self._executor = ThreadPoolExecutor(threads - 1, thread_name_prefix="fastdata")
            self._executor_key = (os.getpid(), threads)
        return self._executor, threads

    # -- Dataset protocol ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int) -> Any:
        """One sample: a tuple in ``fields`` order (the bare value for one field).

        Images are ``(C, H, W)`` or ``(H, W, C)`` uint8 tensors (``layout``), masks and other
        uint8 arrays uint8 tensors, labels int64 scalars, encoded fields with ``decode=False``
        1-D uint8 tensors. Single reads raise :class:`DecodeError` for bad bytes whatever
        ``on_error`` says: there is no batch to drop the sample from.
        """
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        if self.batch_decode is not None:
            self.batch_decode.refuse_in_worker()
        batch = self._read(np.array([index], np.int64), single=True)
        if self.batch_decode is not None:
            batch = self.batch_decode.decode(batch, [int(index)], OnError.RAISE)
        values = tuple(value[0] for value in batch)
        return values if len(values) > 1 else values[0]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """A whole collated batch in one call (DataLoader uses this with a batch sampler).

        Returns:
            A tuple in ``fields`` order (the bare value for one field): images
            ``(B, C, H, W)`` uint8 (a channels-last view of ``(B, H, W, C)`` memory, no
            copy) or ``(B, H, W, C)``, masks ``(B, H, W)`` uint8, labels ``(B,)`` int64, and
            for encoded fields with ``decode=False`` a list of 1-D uint8 tensors. The
            DataLoader's default collate hands it on untouched, as
            :func:`~fastdata.datasets.passthrough_collate` does (its first value is marked
            as collated; both collates return plain tensors).

        With a decoder that runs on whole batches (``decode=`` an ``"nvjpeg"`` or
        ``"dali"`` decoder, or one whose output goes to a device), the images are decoded
        here, ``(B, C, H, W)`` uint8 on the decoder's device, and a sample that does not
        decode leaves every field under ``on_error="skip"|"warn"``; inside a DataLoader
        worker that is refused (``RuntimeError``) unless the batch comes from
        :meth:`loader`, which decodes it after the workers.

        A seeded batch transform (or decoder's random crop) draws per sample from
        ``(seed, epoch, index)`` when
        ``indices`` carries the epoch it belongs to (an ``epoch`` attribute: the batches
        of ``dataset.loader(...)`` do), else from its stream (see
        :class:`~fastdata.transforms.BatchTransform`).
        """
        epoch = getattr(indices, "epoch", None)
        # dataset.loader(...) decodes the encoded images of a batch itself, after the workers
        decodes_here = self.batch_decode is not None and not getattr(indices, "encoded", False)
        if decodes_here and self.batch_decode is not None:
            self.batch_decode.refuse_in_worker()
        array = np.asarray(indices, dtype=np.int64).reshape(-1)
        with self._buffers.worker_slots(_worker_slots(indices)):
            batch = self._read(array, single=False, epoch=epoch if isinstance(epoch, int) else None)
        if decodes_here and self.batch_decode is not None:
            known = epoch if isinstance(epoch, int) else None
            batch = self.batch_decode.decode(batch, array.tolist(), self.on_error, known)
        return mark_collated(pack_for_transfer(batch) if len(batch) > 1 else batch[0])

    def loader(
        self, batch_size: int = 1, *, ragged: str = "list", **kwargs: Any
    ) -> ResumableDataLoader:
        """A :class:`~fastdata.datasets.ResumableDataLoader` over this dataset.

        A ``DataLoader`` with ``collate_fn`` defaulting to
        :func:`~fastdata.datasets.passthrough_collate` whose ``state_dict()`` /
        ``load_state_dict()`` resume mid-epoch exactly (with a
        :class:`~fastdata.datasets.ShardAwareDistributedSampler`), workers or not.

        With a decoder that runs on whole batches as ``decode=`` (``"nvjpeg"``,
        ``"dali"``, an output on a device), the workers (if any) read the encoded bytes
        and the loader decodes each batch in this process, scheduling the next one on the
        decoder while the loop uses this one (a batch read ahead is not counted as
        consumed in ``state_dict()``). A seeded decoder draws each sample's crop from
        ``(seed, epoch, index)``, as the batch transforms draw: a resumed run, another
        ``num_workers`` or ``batch_size`` gets the same crops.

        Args:
            batch_size: Samples per batch.
            ragged: How variable-length fields (boxes, box labels) come: ``"list"`` (a list
                of ``(N_i, ...)`` tensors) or ``"padded"`` (a ``(padded, counts)`` pair:
                ``(B, max_N, ...)`` zero-padded and ``(B,)`` int64 counts; see
                :class:`~fastdata.datasets.RaggedCollate`).
            **kwargs: Any other ``DataLoader`` argument (``sampler``, ``shuffle``,
                ``num_workers``, ``pin_memory``, ...).

        Raises:
            ValueError: ``ragged`` is unknown, or ``batch_size=None`` with a decoder that
                decodes whole batches.

        Example:
            >>> loader = ds.loader(batch_size=64, shuffle=True)            # doctest: +SKIP
            >>> images, labels = next(iter(loader))  # (64, 3, H, W) uint8, (64,) int64
        """
        if ragged not in RAGGED_MODES:
            raise ValueError(f"ragged must be one of {RAGGED_MODES}, got {ragged!r}")
        if ragged == "padded":
            if kwargs.get("collate_fn") is not None:
                raise ValueError("give ragged='padded' or a collate_fn, not both")
            positions = [
                i for i, name in enumerate(self.fields) if self.store.specs[name].kind == "ragged"
            ]
            kwargs["collate_fn"] = RaggedCollate("padded", positions)
        loader = ResumableDataLoader(self, batch_size=batch_size, **kwargs)
        if self.batch_decode is not None:
            if loader.batch_sampler is None:
                raise ValueError(
                    "batch_size=None: the decoder given as decode= decodes whole batches; "
                    "give a batch_size or a batch_sampler"
                )
            loader._decode_batches(self.batch_decode)
        return loader

    # -- reading ------------------------------------------------------------------------
    def _read(self, indices: np.ndarray, single: bool, epoch: int | None = None) -> tuple[Any, ...]:
        executor, tasks = self._pool()
        if not single:
            self.store.begin_batch(indices)
        values: dict[str, Any] = {}
        keep = np.ones(len(indices), bool)
        iou_boxes = self._iou_boxes_field()
        order = self.fields if iou_boxes is None else (iou_boxes, *self.fields)
        for name in dict.fromkeys(order):  # the IoU crop's boxes first: it draws from them
            spec = self.store.specs[name]
            if not spec.field_kind.fixed_size:
                values[name] = self._read_encoded(
                    name,
                    indices,
                    keep,
                    single=single,
                    pool=(executor, tasks),
                    epoch=epoch,
                    boxes=None if iou_boxes is None else values.get(iou_boxes),
                    batch_values=values,
                )
            elif self.plan.rows_in_place(name) and not single:
                # The transform writes a new batch: let it read the stored rows in place.
                values[name] = self.store.rows(name, indices)
                if values[name] is None:
                    values[name] = self._gather(name, spec, indices, executor, tasks)
            else:
                values[name] = self._gather(name, spec, indices, executor, tasks)
        if not keep.all():
            for name, value in values.items():
                if isinstance(value, list):
                    values[name] = [v for v, k in zip(value, keep.tolist(), strict=True) if k]
                else:
                    values[name] = value[torch.from_numpy(keep)]
        if epoch is None:
            self._transform_fields(values, executor, tasks)
        else:  # draws keyed by (seed, epoch, index) for the samples kept
            with batch_draws(epoch, indices[keep]):
                self._transform_fields(values, executor, tasks)
        return tuple(
            values[name]
            if name == self.plan.field and self.plan.per_sample
            else self._to_torch(name, values[name])
            for name in self.fields
        )

    def _iou_boxes_field(self) -> str | None:
        """The boxes field a leading IoU crop run in the decode draws from, or ``None``."""
        if self.plan.decode_iou_crop is None or self.crop_decode is not None:
            return None
        specs = self.store.specs
        return next(name for name in self.plan.target_fields if specs[name].role == "boxes")

    def _gather(
        self, name: str, spec: FieldSpec, indices: np.ndarray, executor: Executor | None, tasks: int
    ) -> torch.Tensor:
        scalar_int = not spec.shape and np.issubdtype(np.dtype(spec.dtype), np.integer)
        dtype = torch.from_numpy(np.empty(0, "int64" if scalar_int else spec.dtype)).dtype
        # Only a transform that writes a new batch reads it: then it is never returned.
        scratch = name in self.plan.moved_fields and (
            self.plan.per_sample or self.plan.reads_input_only
        )
        out = self._buffers.empty((len(indices), *spec.shape), dtype, returned=not scratch)
        target = out.numpy()
        if target.dtype == np.dtype(spec.dtype):
            self.store.gather(name, indices, target, executor, tasks)
        else:  # integer labels stored narrower than int64: widened here
            target[...] = self.store.gather(name, indices, None, executor, tasks)
        return out

    def _read_encoded(
        self,
        name: str,
        indices: np.ndarray,
        keep: np.ndarray,
        *,
        single: bool,
        pool: tuple[Executor | None, int],
        epoch: int | None = None,
        boxes: Any = None,
        batch_values: dict[str, Any] | None = None,
    ) -> list[Any] | torch.Tensor:
        spec = self.store.specs[name]
        raw = self.store.gather(name, indices)
        if spec.encoding == "utf-8":
            return [bytes(item).decode() for item in raw]
        if spec.field_kind.variable_images:  # raw pixels of each image's own size
            return list(raw)  # copies out of the map, one (H_i, W_i, C) array each
        if not self.decode or self.batch_decode is not None or not spec.field_kind.decodes_to_image:
            return [torch.from_numpy(np.array(item)) for item in raw]  # copies out of the map
        decoded: list[Any] = [None] * len(raw)
        failures: list[tuple[int, DecodeError]] = []
        policy = OnError.RAISE if single else self.on_error
        crop_decode, leading_crop = self.crop_decode, self.plan.decode_crop
        iou_crop = self.plan.decode_iou_crop if crop_decode is None else None
        iou_boxes: list[np.ndarray] = []
        draws = None
        if crop_decode is not None or leading_crop is not None or iou_crop is not None:
            # keyed per sample (with an epoch) or from the stream, as the transform draws
            with batch_draws(epoch, indices) if epoch is not None else nullcontext():
                if crop_decode is not None:
                    draws = crop_decode.crop_draws(len(raw))
                elif leading_crop is not None:
                    draws = leading_crop.uniform(len(raw), leading_crop.op.draws_per_sample)
                elif iou_crop is not None:
                    draws = iou_crop.uniform(len(raw), iou_crop.op.draws_per_sample)
        iou_plans: list[Any] = []
        iou_rows = np.zeros((len(raw), 4), np.int64)
        if iou_crop is not None and draws is not None:
            from fastdata.decode.detection import (  # noqa: PLC0415 - decode imports datasets
                decode_into_iou_crop,
                plan_iou_crops,
            )

            iou_boxes = [np.asarray(rows, np.float32).reshape(-1, 4) for rows in boxes]
            buffers = [as_buffer(item) for item in raw]
            out_hw = iou_crop.size or (1, 1)  # set: the plan hands the decode a sized crop
            iou_plans = plan_iou_crops(buffers, iou_boxes, iou_crop.op, draws, out_hw)
            if batch_values is not None:  # the crops the boxes follow (_transform_fields)
                batch_values[_DECODED_CROPS] = torch.from_numpy(iou_rows)

        # A leading random resized crop: every box and DCT scale of the batch planned in one
        # vectorised call here, and each crop decoded straight into its row of the batch.
        # A leading Resize + CenterCrop: each image decoded, resized and cropped into its row.
        planned: list[PlannedCrop | None] = []
        center = self.plan.decode_center if crop_decode is None else None
        crops: torch.Tensor | None = None
        if leading_crop is not None and draws is not None and crop_decode is None:
            planned = plan_crops([as_buffer(item) for item in raw], leading_crop.op, draws)
        decoded_size = None if crop_decode is not None else self.plan.decoded_size
        if decoded_size is not None:
            after = self.plan.after_decode
            crops = self._buffers.empty(
                (len(raw), *decoded_size, 3),
                torch.uint8,
                returned=after is None or after.in_place,
            )
        crop_rows = None if crops is None else crops.numpy()

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                # "warn" keeps a damaged JPEG that decodes (reported below); others refuse it
                damaged: list[DecodeError] | None = [] if policy is OnError.WARN else None
                try:
                    if crop_decode is not None and draws is not None:
                        decoded[k] = crop_decode.decode(
                            raw[k], draws[k], source=name, damaged=damaged
                        )
                    elif iou_crop is not None and draws is not None and crop_rows is not None:
                        iou_rows[k] = decode_into_iou_crop(
                            as_buffer(raw[k]),
                            iou_plans[k],
                            iou_boxes[k],
                            iou_crop.op,
                            draws=draws[k],
                            out=crop_rows[k],
                            source=name,
                            max_pixels=self.max_pixels,
                            damaged=damaged,
                        )
                    elif leading_crop is not None and draws is not None:
                        decode_into_crop(
                            raw[k],
                            leading_crop.op,
                            draws[k],
                            source=name,
                            max_pixels=self.max_pixels,
                            damaged=damaged,
                            planned=planned[k],
                            out=None if crop_rows is None else crop_rows[k],
                        )
                    elif center is not None and crop_rows is not None:
                        decode_into_center(
                            raw[k],
                            *center,
                            crop_rows[k],
                            min_side=self.decode_min_side,
                            source=name,
                            max_pixels=self.max_pixels,
                            damaged=damaged,
                        )
                    else:
                        decoded[k] = decode_image(
                            raw[k],
                            min_side=self.decode_min_side,
                            max_pixels=self.max_pixels,
                            source=name,
                            damaged=damaged,
                        )
                except DecodeError as exc:
                    failures.append((k, exc))
                failures.extend((k, note) for note in damaged or ())

        # one image at a time: decode costs differ by image size
        parallel_for(pool[0], len(raw), body, tasks=pool[1], chunk=1)
        for k, exc in sorted(failures, key=lambda item: item[0]):
            index = int(indices[k])
            error = exc.with_source(f"dataset[{index}], {self.store.source(index)}")
            policy.handle(error, stacklevel=4)
            keep[k] = keep[k] and error.kept
        return decoded if crops is None else crops

    def _transform_fields(
        self, values: dict[str, Any], executor: Executor | None, tasks: int
    ) -> None:
        """Apply the transform: a batch transform once per batch to a
        :class:`~fastdata.transforms.FieldBatch` of the image field (NumPy
        ``(B, H, W, C)``), its masks and its targets (boxes, box labels), each moved by its
        role; any other callable per sample on a ``(C, H, W)`` tensor of the image field
        only (the output stacked in ``layout``)."""
        plan = self.plan
        name = plan.field
        if name is None or plan.transform is None:
            return
        images = values[name]
        if plan.per_sample:
            outputs = [plan.transform(self._image_tensor(image)) for image in images]
            values[name] = self._stack_transformed(outputs)
            return
        transform: BatchTransform = plan.transform  # type: ignore[assignment]
        if plan.decoded_size is not None:  # its leading crop ran in the decode
            decoded_crops = values.pop(_DECODED_CROPS, None)
            if plan.decode_iou_crop is not None and decoded_crops is not None:
                self._move_targets(values, plan.decode_iou_crop, decoded_crops.numpy())
            if plan.after_decode is None:
                return
            transform = plan.after_decode

        def numpy(batch: Any) -> Any:
            return batch.numpy() if isinstance(batch, torch.Tensor) else batch

        out = self._transform_out(len(images))

        def as_given(result: Any) -> Any:
            # Written into `out` or in place: return that tensor (in a worker, the shared
            # memory the batch is sent in), not a new tensor wrapping its NumPy view, which
            # a worker would copy into shared memory once more to send it.
            for tensor in (out, images):
                if isinstance(tensor, torch.Tensor) and _is_array_of(result, tensor):
                    return tensor
            return result

        if not plan.mask_fields and not plan.target_fields and out is None:
            values[name] = as_given(transform.apply(numpy(images), executor, tasks))
            return
        masks = [numpy(values[mask]) for mask in plan.mask_fields]
        check_masks(numpy(images), masks, plan.mask_fields)
        specs = self.store.specs
        batch = FieldBatch(
            {
                name: numpy(images),
                **dict(zip(plan.mask_fields, masks, strict=True)),
                **{target: _arrays(values[target]) for target in plan.target_fields},
            },
            {field: specs[field].role for field in (name, *plan.mask_fields, *plan.target_fields)},
        )
        moved = transform.apply_batch(batch, executor, tasks, None if out is None else out.numpy())
        values[name] = as_given(moved.values[name])
        for field in (*plan.mask_fields, *plan.target_fields):
            values[field] = moved.values[field]

    def _move_targets(
        self, values: dict[str, Any], crop: BatchTransform, crops: np.ndarray
    ) -> None:
        """Move the target fields (boxes, their labels) by the crops a leading crop cut
        in the decode, resized to the decoded size, with the crop's box rule."""
        plan, specs = self.plan, self.store.specs
        size = plan.decoded_size or (1, 1)
        targets = FieldBatch(
            {target: _arrays(values[target]) for target in plan.target_fields},
            {target: specs[target].role for target in plan.target_fields},
        )
        geometry = Geometry.of(crops, np.tile(np.array(size, np.int64), (len(crops), 1)))
        moved = apply_geometry(crop, targets, geometry)
        for target in plan.target_fields:
            values[target] = moved.values[target]

    def _transform_out(self, count: int) -> torch.Tensor | None:
        """The shared-memory batch of ``count`` images the transform writes into inside a
        DataLoader worker, so that sending it to the training process copies nothing;
        ``None`` where the transform allocates its own: in the training process (its
        allocator already recycles that memory, in huge pages, which a reused batch buffer
        does not beat) and when the output size is unknown in advance."""
        plan = self.plan
        if not plan.writes_out or plan.field is None or plan.output_size is None or not count:
            return None
        if get_worker_info() is None:
            return None
        spec = self.store.specs[plan.field]  # (H, W, C) rows, or the (C,) of varying images
        channels = tuple(spec.shape if spec.field_kind.variable_images else spec.shape[2:])
        shape = (count, *plan.output_size, *channels)
        return self._buffers.empty(shape, torch.uint8, returned=True)

    def _stack_transformed(self, outputs: list[Any]) -> torch.Tensor:
        """Stack per-sample transform outputs into one batch in ``layout``.

        The transform gets ``(C, H, W)`` and returns ``(C, H', W')`` (or ``(H', W')``);
        the batch is ``(B, C, H', W')`` for ``"CHW"`` and a ``(B, H', W', C)`` view for
        ``"HWC"``.

        Raises:
            TypeError: An output is not a tensor or an array.
            ValueError: Outputs differ in shape (they cannot make one batch).
        """
        if not outputs:
            return torch.empty(0, dtype=torch.uint8)
        tensors = []
        for item in outputs:
            output = torch.from_numpy(item) if isinstance(item, np.ndarray) else item
            if not isinstance(output, torch.Tensor):
                raise TypeError(
                    f"transform {self.transform!r} returned {type(output).__name__}; a "
                    "per-sample transform must return a tensor (end it with e.g. "
                    "torchvision's transforms.v2.ToImage() / PILToTensor())"
                )
            tensors.append(output)
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            raise ValueError(
                f"transform {self.transform!r} returned samples of different shapes "
                f"{sorted(shapes)[:3]}: a per-sample transform gets (C, H, W) and must give "
                "every sample one shape (add a Resize/CenterCrop to a fixed size)"
            )
        shape, dtype = (len(tensors), *tensors[0].shape), tensors[0].dtype
        batch = torch.stack(tensors, out=self._buffers.empty(shape, dtype, returned=True))
        if batch.dim() == 4 and self.layout == "HWC":
            return batch.permute(0, 2, 3, 1)
        return batch

    @staticmethod
    def _image_tensor(image: np.ndarray | torch.Tensor) -> torch.Tensor:
        """A per-sample transform's input: ``(C, H, W)`` uint8 (``(H, W)`` for gray), the
        torchvision convention, whatever ``layout`` the batches have."""
        tensor = image if isinstance(image, torch.Tensor) else torch.from_numpy(image)
        if tensor.dim() == 3:
            return tensor.permute(2, 0, 1)
        return tensor

    def _to_torch(self, name: str, value: Any) -> Any:
        spec = self.store.specs[name]
        if isinstance(value, list):
            if not value or not isinstance(value[0], np.ndarray):
                return value  # encoded bytes as 1-D tensors, or strings
            if spec.field_kind.variable_images:  # images of their own sizes, in layout
                chw = self.layout == "CHW" and spec.field_kind.sample_axes == "HWC"
                tensors = [torch.from_numpy(item) for item in value]
                return [t.permute(2, 0, 1) for t in tensors] if chw else tensors
            if not spec.field_kind.decodes_to_image:  # variable-length rows stay a list
                return [torch.from_numpy(np.ascontiguousarray(item)) for item in value]
            value = stack_images(value)
        tensor = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        channels_last = spec.field_kind.sample_axes == "HWC"
        if tensor.dim() == 4 and channels_last and self.layout == "CHW":
            tensor = tensor.permute(0, 3, 1, 2)
        return tensor

    @property
    def nbytes(self) -> int:
        """Bytes this dataset holds in RAM (0 for memory-mapped shards: those pages belong
        to the OS page cache)."""
        return self.store.nbytes if isinstance(self.store, RAMStore) else 0

    def memory_report(self) -> MemoryReport:
        """Bytes held in RAM per field, where they live, and the memory still available."""
        in_ram = isinstance(self.store, RAMStore)
        sizes = self.store.field_nbytes() if isinstance(self.store, RAMStore) else {}
        return MemoryReport(len(self), sizes, in_ram, available_memory_bytes())

    def close(self) -> None:
        """Release files, mappings and threads held by this process."""
        if self._executor is not None and self._executor_key[0] == os.getpid():
            self._executor.shutdown(wait=False)
        self._executor = None
        self._buffers.clear()
        self.store.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_executor"] = None
        if not isinstance(self.options.decode, bool):
            # A Decoder's threads, pipelines and device state stay in this process: a copy
            # (a spawned worker, another rank) decodes with the geometry kept in crop_decode,
            # or (batch_decode) reads the bytes for a loader here to decode, or, in another
            # training process, makes its own decoder from the recipe.
            state["options"] = dataclasses.replace(self.options, decode=True)
        return state


def _override_roles(store: Store, fields: Sequence[str], roles: Mapping[str, str] | None) -> None:
    """Give the fields named in ``roles`` that role instead of the manifest's.

    Raises:
        TypeError: ``roles`` is not a mapping.
        ValueError: A name is not one of ``fields``, or a role is unknown.
    """
    if roles is None:
        return
    if not isinstance(roles, Mapping):
        raise TypeError(f"roles must be a mapping of field name to role, got {roles!r}")
    for name, role in roles.items():
        if name not in fields:
            raise ValueError(f"roles names field {name!r}, which is not one of fields {fields}")
        check_role(role, f"roles[{name!r}]")
        store.specs[name] = dataclasses.replace(store.specs[name], role=role)


def _worker_slots(indices: Any) -> int:
    """The ring of batch segments a ``ResumableDataLoader``'s index batch asks a worker to
    keep (0: none; it frees them in the training process)."""
    count = getattr(indices, "worker_slots", 0)
    return count if isinstance(count, int) and get_worker_info() is not None else 0


def _arrays(value: Any) -> Any:
    """A field's batch as NumPy: a tensor's array, a list's items as arrays."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, list):
        return [item.numpy() if isinstance(item, torch.Tensor) else item for item in value]
    return value


def _is_array_of(array: Any, tensor: torch.Tensor) -> bool:
    """Whether NumPy ``array`` is exactly ``tensor``'s memory, shape and strides."""
    return (
        isinstance(array, np.ndarray)
        and array.ctypes.data == tensor.data_ptr()
        and array.shape == tuple(tensor.shape)
        and array.strides == tuple(s * tensor.element_size() for s in tensor.stride())
    )

"""The batch-transform protocol, random state per worker, the base of the transforms that
run a :mod:`fastdata.ops` description, and ``Compose``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Union

import numpy as np
import torch

from fastdata import _roles, ops
from fastdata._boxes import DEFAULT_MIN_SIZE, DEFAULT_MIN_VISIBILITY
from fastdata._draws import UniformDraws
from fastdata._fields import MOVERS, FieldBatch, as_field_batch
from fastdata._images import Images, check_images, check_masks, stack_images

BatchInput = Union[Images, torch.Tensor]  # noqa: UP007


class BatchTransform:
    """Base of the per-batch uint8 augmentations.

    A batch transform takes a whole batch and returns one. fastdata datasets recognise
    it by ``batched = True`` and call it once per batch with their thread pool; any other
    callable given as ``transform`` is applied per sample (torchvision style).

    Called directly, it accepts a ``(B, C, H, W)`` uint8 tensor and returns one (a
    channels-last view, no copy back to planar), or NumPy ``(B, H, W, C)`` uint8 / a list of
    ``(H, W, C)`` uint8 arrays and returns NumPy. Inputs may be modified in place.

    Masks follow the images: :meth:`apply_all` takes the image batch plus any number of
    mask batches (``(B, H, W)`` uint8, or a list of ``(H, W)`` uint8, one per image of the
    same height and width) and moves every mask's pixels exactly as the image's, from the
    same random draw, resampling them nearest-neighbour so labels stay labels.
    :meth:`apply_batch` is the general form, which datasets call: a
    :class:`~fastdata.transforms.FieldBatch` of fields with roles in, one out (images,
    masks, boxes and box labels moved from one draw). A geometric transform
    (:class:`~fastdata.transforms.GeometricTransform`) implements ``geometry`` only; one
    that moves pixels its own way overrides :meth:`apply_all`; one that only changes values
    (colour, noise) overrides :meth:`apply` and leaves masks and boxes as they are.

    Each transform declares what it makes of its input before any batch is read, the way
    a dataset needs it to check sizes at construction: :meth:`output_size` (the output
    ``(height, width)`` for an input size, raising when the input is too small),
    ``in_place`` (``False``: it only reads its input and writes a new batch, so datasets
    may pass stored rows without a copy), ``keeps_size`` and ``min_input_side`` (JPEG
    decoders may decode at a reduced scale down to this side). A transform with
    ``writes_out = True`` writes its image output into the ``out`` array that
    :meth:`apply_all` is given, so a dataset can hand it the memory the batch is returned
    in (a DataLoader worker's shared memory) instead of copying it there; others
    are never given one.

    Random parameters come from ``torch``'s default generator, which ``DataLoader`` seeds
    per worker from the main process's seed (so ``torch.manual_seed(s)`` makes a run
    reproducible), or, when ``seed`` is given, from a generator seeded with ``seed`` plus
    7919 times the worker id: reproducible per worker whatever the global state. The
    decoders draw the same way (:class:`fastdata._draws.UniformDraws`), so one seed gives
    one crop box in the decoder, here and in the device module. In a batch read through
    ``dataset.loader(...)``, which tells the dataset the batch's epoch, a seeded
    transform's draws are keyed per sample by ``(seed, epoch, index)`` instead
    (:func:`fastdata._draws.batch_draws`): draw them in the calling thread, once per
    batch.
    """

    batched = True
    moves_pixels = False  # True: the geometry changes (fields of every moved role follow)
    interpolation: int | None = None  # the image kernel (None: antialiased, see _resize)
    # Boxes are dropped below this clipped side (pixels) or visible fraction (_boxes).
    min_box_size: float = DEFAULT_MIN_SIZE
    min_box_visibility: float = DEFAULT_MIN_VISIBILITY
    min_input_side: int | None = None  # decoders may decode JPEGs reduced down to this
    in_place = True  # False: never writes to its input (datasets may pass stored rows)
    keeps_size = True  # False: outputs have another height and width than their inputs
    writes_out = False  # True: apply_all writes the images into its `out` array

    def __init__(self, seed: int | None = None) -> None:
        self._draws = UniformDraws(seed)
        self.seed = self._draws.seed

    def generator(self) -> torch.Generator | None:
        """This process's generator: ``None`` (torch's default) unless ``seed`` was given."""
        return self._draws.generator()

    def uniform(self, count: int, columns: int = 1) -> np.ndarray:
        """``(count, columns)`` float64 uniform draws in [0, 1)."""
        return self._draws.uniform(count, columns)

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The ``(height, width)`` of the outputs for inputs of ``size``.

        Args:
            size: The inputs' ``(height, width)``, or ``None`` when it varies (encoded
                images).

        Returns:
            The outputs' size, or ``None`` when it depends on each input. This default
            keeps the size (transforms that move no pixels).

        Raises:
            ValueError: Inputs of ``size`` are too small for this transform.
        """
        return size

    def apply(self, images: Images, executor: Executor | None, tasks: int) -> Images:
        """Transform NumPy images; subclasses implement this or :meth:`apply_all`."""
        if type(self).apply_all is BatchTransform.apply_all:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither apply nor apply_all"
            )
        return self.apply_all(images, [], executor, tasks)[0]

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        """Transform NumPy images and move ``masks`` alike.

        Args:
            images: ``(B, H, W, C)`` uint8 array or a list of ``(H, W, C)`` uint8 arrays.
            masks: Mask batches, each ``(B, H, W)`` uint8 or a list of ``(H, W)`` uint8
                arrays matching the images' heights and widths.
            executor: Optional thread pool for the per-sample OpenCV work.
            tasks: Number of slices to split the batch into on ``executor``.
            out: Where to write the output images, a C-contiguous uint8 array of the
                output's shape; only given to transforms with ``writes_out = True`` (this
                default ignores it). The masks are still allocated.

        Returns:
            The transformed images and masks. This default applies :meth:`apply` to the
            images and returns the masks untouched (right for transforms that move no
            pixels).
        """
        return self.apply(images, executor, tasks), list(masks)

    def apply_batch(
        self,
        batch: FieldBatch,
        executor: Executor | None = None,
        tasks: int = 1,
        out: np.ndarray | None = None,
    ) -> FieldBatch:
        """Transform a batch of named fields with roles and return one: the convention
        every executor shares.

        Geometric transforms (``moves_pixels``) draw once per batch and move every field
        whose role has a mover (images, masks, boxes, registered roles); this default, for
        transforms that move pixels their own way (:meth:`apply_all`: colour steps, affine
        policies), runs :meth:`apply_all` on the first image field and the masks and passes
        the other fields through; it refuses boxes (or another moved role) when it moves
        pixels, since it has no box geometry.

        Args:
            batch: The fields; image fields NumPy ``(B, H, W, C)`` uint8 or lists of
                ``(H, W, C)``, masks ``(B, H, W)``, boxes lists of ``(N_i, 4)`` float32.
            executor: Optional thread pool for the per-sample work.
            tasks: Number of slices to split the batch into on ``executor``.
            out: Where to write the first image field's output (``writes_out`` only).

        Raises:
            ValueError: A moved role this transform cannot move, or more than one image
                field for a transform that moves pixels.
        """
        images = batch.names(_roles.IMAGE)
        if not images:
            return batch
        masks = batch.names(_roles.MASK)
        if self.moves_pixels:
            for name in batch:
                role = batch.role(name)
                if role in MOVERS and role not in (_roles.IMAGE, _roles.MASK):
                    raise ValueError(
                        f"{self!r} moves pixels but cannot move the {role} field {name!r}: "
                        "use the crops, resizes and flips of fastdata.transforms with "
                        f"{role}, or leave {name!r} out of the batch"
                    )
            if len(images) > 1:
                raise ValueError(
                    f"{self!r} moves one image field per batch, got {images}: read one"
                )
        values = dict(batch.values)
        given = {} if out is None else {"out": out}  # only writes_out transforms take one
        moved_images, moved = self.apply_all(
            values[images[0]], [values[m] for m in masks], executor, tasks, **given
        )
        values[images[0]] = moved_images
        values.update(zip(masks, moved, strict=True))
        for name in images[1:]:  # value-only transforms: every image field alike
            values[name] = self.apply(values[name], executor, tasks)
        return FieldBatch(values, dict(batch.roles))

    def __call__(
        self,
        images: BatchInput | Mapping[str, Any],
        executor: Executor | None = None,
        tasks: int = 1,
        masks: BatchInput | None = None,
        roles: Mapping[str, str] | None = None,
    ) -> Any:
        """Transform a batch.

        A mapping of fields (or a :class:`~fastdata.transforms.FieldBatch`) is transformed
        with :meth:`apply_batch` and a :class:`~fastdata.transforms.FieldBatch` returned,
        every field moved by its role (``roles``; by default from the names: ``image``,
        ``mask``, ``boxes``, ``labels`` are box labels, ``label`` a class per sample).
        Image fields there are NumPy ``(B, H, W, C)`` uint8 (or lists), boxes lists of
        ``(N_i, 4)`` float32 xyxy pixels. Otherwise:

        Args:
            images: ``(B, C, H, W)`` uint8 tensor, ``(B, H, W, C)`` uint8 array, or a list
                of ``(H, W, C)`` uint8 arrays.
            executor: Optional thread pool for the per-sample OpenCV work.
            tasks: Number of slices to split the batch into on ``executor``.
            masks: Optional ``(B, H, W)`` uint8 masks (tensor, array or list of arrays)
                cropped, resized and flipped like the images (nearest-neighbour).

        Returns:
            The same kind of batch: a tensor for a tensor input, NumPy otherwise; with
            ``masks``, an ``(images, masks)`` pair.

        Raises:
            ValueError: A batch of the wrong dtype or rank, or masks whose count, height or
                width differ from the images'.
        """
        if isinstance(images, Mapping | FieldBatch):
            batch = as_field_batch(images, roles)
            if self.in_place:
                batch = _contiguous_fields(batch)
            return self.apply_batch(batch, executor, tasks)
        tensor_masks = isinstance(masks, torch.Tensor)
        mask_list: list[Images] = []
        if masks is not None:
            if isinstance(masks, torch.Tensor):
                if masks.dtype != torch.uint8 or masks.dim() != 3:
                    raise ValueError(
                        f"masks must be a (B, H, W) uint8 tensor, "
                        f"got {tuple(masks.shape)} {masks.dtype}"
                    )
                mask_list = [masks.numpy()]
            else:
                mask_list = [check_images(masks)]
        if isinstance(images, torch.Tensor):
            if images.dtype != torch.uint8 or images.dim() != 4:
                raise ValueError(
                    f"images must be a (B, C, H, W) uint8 tensor, "
                    f"got {tuple(images.shape)} {images.dtype}"
                )
            array: Images = images.permute(0, 2, 3, 1).numpy()
        else:
            array = check_images(images)
        if self.in_place:
            # The kernels write whole rows in place, which needs C-contiguous samples; a
            # planar tensor's channels-last view (or a strided array) is copied once here.
            array = _contiguous(array)
            mask_list = [_contiguous(mask) for mask in mask_list]
        check_masks(array, mask_list)
        result, moved = self.apply_all(array, mask_list, executor, tasks)
        out: BatchInput = result
        if isinstance(images, torch.Tensor):
            out = torch.from_numpy(stack_images(result)).permute(0, 3, 1, 2)
        if masks is None:
            return out
        return out, torch.from_numpy(stack_images(moved[0])) if tensor_masks else moved[0]


def check_out(out: np.ndarray, shape: tuple[int, ...]) -> None:
    """Check that ``out`` can take a ``shape`` uint8 batch written row by row.

    Args:
        out: The destination given to :meth:`BatchTransform.apply_all`.
        shape: The output's shape.

    Raises:
        ValueError: ``out`` has another shape or dtype, or is not C-contiguous.
    """
    if out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous {shape} uint8 array, got {out.shape} {out.dtype}"
            + ("" if out.flags.c_contiguous else " (not C-contiguous)")
        )


def _contiguous_fields(batch: FieldBatch) -> FieldBatch:
    """``batch`` with its image and mask samples C-contiguous (for in-place kernels)."""
    values = dict(batch.values)
    for name in (*batch.names(_roles.IMAGE), *batch.names(_roles.MASK)):
        values[name] = _contiguous(check_images(values[name]))
    return FieldBatch(values, dict(batch.roles))


def _contiguous(images: Images) -> Images:
    """``images`` with every sample C-contiguous (copied only where one is not)."""
    if isinstance(images, np.ndarray):
        return np.ascontiguousarray(images)
    return [np.ascontiguousarray(image) for image in images]


class OpTransform(BatchTransform, ops.Executor):
    """A batch transform that runs one :mod:`fastdata.ops` description (``op``) on the
    CPU: the description states the output and draws the parameters, the subclass holds
    the OpenCV kernel only.

    Args:
        op: The description.
        seed: See :class:`BatchTransform`.
    """

    def __init__(self, op: ops.Operation, seed: int | None = None) -> None:
        super().__init__(seed)
        self.op = op
        self.moves_pixels = self.moves_pixels or bool(getattr(op, "moves_pixels", False))
        self.in_place = not op.reads_only
        self.keeps_size = op.keeps_size
        self.min_input_side = op.min_input_side

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The description's :meth:`~fastdata.ops.Operation.output_size`."""
        return self.op.output_size(size)

    def __repr__(self) -> str:
        # the description's fields under this class's name: RandomHorizontalFlip(p=0.5)
        return type(self).__name__ + repr(self.op).removeprefix(type(self.op).__name__)


class Compose(BatchTransform):
    """Apply batch transforms in order.

    Example:
        >>> train = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    """

    def __init__(self, transforms: Sequence[BatchTransform]) -> None:
        super().__init__()
        bad = [t for t in transforms if not getattr(t, "batched", False)]
        if bad:
            raise TypeError(f"Compose takes batch transforms (batched = True), got {bad[0]!r}")
        self.transforms = list(transforms)
        # The first transform is the one that reads the input batch (or writes into it).
        self.in_place = self.transforms[0].in_place if self.transforms else True
        self.keeps_size = all(t.keeps_size for t in self.transforms)
        self.moves_pixels = any(t.moves_pixels for t in self.transforms)
        # The side the first resize needs, past transforms that keep sizes (a flip first).
        self.min_input_side = None
        for transform in self.transforms:
            if transform.min_input_side is not None or not transform.keeps_size:
                self.min_input_side = transform.min_input_side
                break
        # What runs: the transforms, a step folded with the one after it where it offers
        # (a crop and the flip after it: one geometry, each flip made while in cache).
        self._steps = _folded(self.transforms)
        # `out` goes to the last step that writes one when every later step keeps the size
        # (a flip after a crop flips `out` in place).
        self._out_step: int | None = None
        for index in reversed(range(len(self._steps))):
            if self._steps[index].writes_out:
                self._out_step = index
                break
            if not self._steps[index].keeps_size:
                break
        self.writes_out = self._out_step is not None

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        for transform in self.transforms:
            size = transform.output_size(size)
        return size

    def apply(self, images: Images, executor: Executor | None, tasks: int) -> Images:
        for transform in self._steps:
            images = transform.apply(images, executor, tasks)
        return images

    def apply_batch(
        self,
        batch: FieldBatch,
        executor: Executor | None = None,
        tasks: int = 1,
        out: np.ndarray | None = None,
    ) -> FieldBatch:
        for index, transform in enumerate(self._steps):
            given = out if out is not None and index == self._out_step else None
            batch = transform.apply_batch(batch, executor, tasks, given)
        return batch

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        moved = list(masks)
        for index, transform in enumerate(self._steps):
            if out is not None and index == self._out_step:
                images, moved = transform.apply_all(images, moved, executor, tasks, out=out)
            else:
                images, moved = transform.apply_all(images, moved, executor, tasks)
        return images, moved

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


def _folded(transforms: Sequence[BatchTransform]) -> list[BatchTransform]:
    """``transforms`` with each one folded into the step before it where that step's
    ``fold`` offers one step for both (the same result)."""
    steps: list[BatchTransform] = []
    for transform in transforms:
        fold = getattr(steps[-1], "fold", None) if steps else None
        folded = fold(transform) if fold is not None else None
        if folded is not None:
            steps[-1] = folded
        else:
            steps.append(transform)
    return steps

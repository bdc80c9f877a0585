"""``RAMDataset``: a whole dataset in one shared-memory buffer per field."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastdata._labels import label_array
from fastdata.datasets._base import BatchedDataset
from fastdata.datasets._loading import load_arrays, load_files, load_shards
from fastdata.datasets._options import NOT_GIVEN, ReadOptions
from fastdata.datasets._store import RAMStore, known_fields
from fastdata.errors import OnError

if TYPE_CHECKING:
    from fastdata.decode import Decoder
    from fastdata.shards import Manifest


class RAMDataset(BatchedDataset):
    """A dataset held in RAM: encoded file bytes decoded on access, or raw pixels.

    Storage is one contiguous ``uint8`` buffer per field plus ``int64`` offsets for
    variable-length fields (file paths are packed the same way): no per-sample Python
    objects, so forked workers never copy pages they only read (the copy-on-read growth
    of a list of ``bytes``, pytorch issue 13246). The buffers are anonymous shared memory
    (``memfd``): forked workers inherit them, spawned or forkserver workers (and any
    process the dataset is pickled into through ``torch.multiprocessing``) map the same
    pages instead of copying them. The memory is freed when the last process using it
    closes it or exits, crash included; nothing is left in ``/dev/shm``.

    Before loading, the bytes needed are compared with the available memory
    (cgroup-aware); a load that does not fit raises :class:`InsufficientMemoryError`
    naming both figures unless ``check_memory=False``.

    Args:
        image_paths: Image files (any format OpenCV reads); their bytes are kept as is.
        targets: One integer label per image, in ``0..2**63 - 1`` (``None``: images only).
        transform: As for :class:`ShardDataset`.
        layout: As for :class:`ShardDataset`.
        decode: As for :class:`ShardDataset`. ``decode=False`` returns the file bytes as
            1-D uint8 tensors (for GPU decoding).
        decode_min_side: As for :class:`ShardDataset`.
        on_error: As for :class:`ShardDataset`.
        num_threads: As for :class:`ShardDataset`.
        check_memory: Refuse a load larger than the available memory.
        show_progress: Progress bar while loading.
        max_pixels: With ``decode=True``, an image whose header claims more pixels (width x
            height) is refused before decoding, like a corrupt file (``on_error`` applies);
            ``0`` or ``None``: no limit. Default: PIL's limit, 89,478,485.
        options: As for :class:`ShardDataset`: a :class:`ReadOptions` instead of the
            keywords ``layout`` to ``max_pixels`` (a keyword passed with it, even at its
            default value, is a ``TypeError``).

    Attributes:
        manifest: The shard set's :class:`~fastdata.shards.Manifest` for a dataset from
            :meth:`from_shards` (the same value as ``ShardDataset.manifest``), ``None``
            for image files and arrays.

    Raises:
        ValueError: ``image_paths`` is empty, ``targets`` has another length, or
            ``max_pixels`` is negative or not an int.
        FileNotFoundError: An image file cannot be read (its index and path are named).
        InsufficientMemoryError: The data would not fit in the available memory.

    Example:
        >>> ds = RAMDataset(paths, labels, transform=RandomResizedCrop(224))    # doctest: +SKIP
        >>> loader = DataLoader(ds, batch_size=64, num_workers=2,
        ...                     collate_fn=passthrough_collate)                 # doctest: +SKIP
    """

    manifest: Manifest | None

    def __init__(
        self,
        image_paths: Sequence[str | os.PathLike[str]],
        targets: Sequence[int] | np.ndarray | torch.Tensor | None,
        transform: Callable[..., Any] | None = None,
        *,
        layout: str = NOT_GIVEN,
        decode: bool | Decoder = NOT_GIVEN,
        decode_min_side: int | None = NOT_GIVEN,
        on_error: OnError | str = NOT_GIVEN,
        num_threads: int | None = NOT_GIVEN,
        check_memory: bool = True,
        show_progress: bool = True,
        max_pixels: int | None = NOT_GIVEN,
        options: ReadOptions | None = None,
    ) -> None:
        read = ReadOptions.from_arguments(
            options,
            layout=layout,
            decode=decode,
            decode_min_side=decode_min_side,
            on_error=on_error,
            num_threads=num_threads,
            max_pixels=max_pixels,
        )
        if isinstance(image_paths, (str, os.PathLike)) or len(image_paths) == 0:
            raise ValueError(
                f"image_paths must be a non-empty sequence of paths, got {image_paths!r}"
            )
        labels = None if targets is None else label_array(targets, len(image_paths))
        store = load_files(
            image_paths, labels, override_memory_check=not check_memory, show_progress=show_progress
        )
        fields = ("image",) if labels is None else ("image", "label")
        self.manifest = None
        super().__init__(store, fields=fields, transform=transform, options=read)

    @classmethod
    def from_shards(
        cls,
        path: str | Path,
        fields: Sequence[str] = ("image", "label"),
        transform: Callable[..., Any] | None = None,
        *,
        check_memory: bool = True,
        show_progress: bool = True,
        cache_dir: str | Path | None = None,
        cache_limit: int | str | None = None,
        options: ReadOptions | None = None,
        **read: Any,
    ) -> RAMDataset:
        """Load ``fields`` of a shard set into RAM (raw pixels stay raw, JPEG bytes stay
        encoded). ``path`` may be a URL such as ``s3://bucket/set/``: shards then come
        through the cache ``cache_dir`` of at most ``cache_limit`` bytes, as for
        :class:`ShardDataset`. ``options`` is a :class:`ReadOptions`, or ``read`` its
        fields as keywords (``layout``, ``decode``, ``roles``, ...)."""
        read_options = ReadOptions.from_arguments(options, **read)  # checked before loading
        store, manifest = load_shards(
            path,
            known_fields(path, fields),
            override_memory_check=not check_memory,
            show_progress=show_progress,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
        )
        dataset = cls._wrap(store, fields, transform, read_options)
        dataset.manifest = manifest
        return dataset

    @classmethod
    def from_arrays(
        cls,
        images: np.ndarray | torch.Tensor,
        targets: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        transform: Callable[..., Any] | None = None,
        *,
        masks: np.ndarray | torch.Tensor | None = None,
        check_memory: bool = True,
        options: ReadOptions | None = None,
        **read: Any,
    ) -> RAMDataset:
        """Copy in-memory arrays into shared buffers.

        Args:
            images: ``(N, H, W, C)`` or ``(N, H, W)`` uint8.
            targets: ``N`` integer labels in ``0..2**63 - 1`` (returned as int64), or ``None``.
            masks: Optional ``(N, H, W)`` uint8, returned after the labels.
            options: A :class:`ReadOptions`, or ``read`` its fields as keywords.
        """
        read_options = ReadOptions.from_arguments(options, **read)
        image_array = _uint8(images, "images", (3, 4))
        arrays = {"image": image_array}
        axes = {"image": "NHWC"[1 : image_array.ndim] if image_array.ndim == 4 else "HW"}
        if targets is not None:
            arrays["label"] = label_array(targets, len(image_array))
            axes["label"] = ""
        if masks is not None:
            arrays["mask"] = _uint8(masks, "masks", (3,))
            axes["mask"] = "HW"
        store = load_arrays(arrays, axes, override_memory_check=not check_memory)
        return cls._wrap(store, tuple(arrays), transform, read_options)

    @classmethod
    def _wrap(
        cls, store: RAMStore, fields: Sequence[str], transform: Any, options: ReadOptions
    ) -> RAMDataset:
        dataset = cls.__new__(cls)
        dataset.manifest = None
        BatchedDataset.__init__(dataset, store, fields=fields, transform=transform, options=options)
        return dataset

    @property
    def class_names(self) -> list[str]:
        """Label ``i`` is ``class_names[i]``: from the manifest of a set loaded with
        :meth:`from_shards` (as :attr:`ShardDataset.class_names`), else empty."""
        return [] if self.manifest is None else self.manifest.class_names


def _uint8(array: np.ndarray | torch.Tensor, name: str, ndims: tuple[int, ...]) -> np.ndarray:
    result = array.numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    if result.dtype != np.uint8 or result.ndim not in ndims:
        raise ValueError(
            f"{name} must be a uint8 array with {' or '.join(map(str, ndims))} dimensions, "
            f"got {result.shape} {result.dtype}"
        )
    return result

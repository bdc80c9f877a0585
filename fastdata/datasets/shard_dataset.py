"""``ShardDataset``: a training dataset over a ``fastdata preprocess`` output."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdata.datasets._base import BatchedDataset
from fastdata.datasets._options import NOT_GIVEN, ReadOptions
from fastdata.datasets._store import ShardStore, known_fields
from fastdata.errors import OnError

if TYPE_CHECKING:
    from fastdata.decode import Decoder
    from fastdata.shards.reader import CacheFolder, CacheRoom


class ShardDataset(BatchedDataset):
    """Samples of a shard set as uint8 tensors, read in whole batches.

    Files are opened lazily in each process that reads (handles are never inherited
    across ``fork``), so the dataset works with ``fork``, ``spawn`` and ``forkserver``
    workers and with ``persistent_workers``. Uncompressed fields are memory-mapped.

    Use it with a standard ``DataLoader`` (its default collate, or
    :func:`passthrough_collate`, hands the batches on) or :meth:`loader`:
    ``__getitems__`` reads a whole batch (indices grouped by shard, in file order) into one
    preallocated batch. For raw pixels the fastest setting is usually ``num_workers=0``
    with ``num_threads`` threads doing the copies in the training process; for JPEG
    shards, worker processes that decode.

    Args:
        path: The shard folder (or its ``index.json``), or a URL such as
            ``s3://bucket/set/`` (shards downloaded whole into a local cache, checked
            against the manifest's SHA-256, then read like local ones; see the object
            storage guide).
        fields: Fields to return, in order. Each has the role the manifest gives it
            (``ds.roles``): the ``transform`` applies to the first ``image`` field and moves
            ``mask``, ``boxes`` and ``box_labels`` fields with it.
        transform: A :class:`~fastdata.transforms.BatchTransform` (applied once per batch
            to the image ``(B, H, W, C)`` uint8 and the fields that follow it, by role), or
            any callable applied per sample to the image's
            ``(C, H, W)`` uint8 tensor whatever ``layout`` (torchvision style); it must
            return one shape for every sample, and the batch is stacked in ``layout``.
            What a batch transform declares is read once, here: stored images too small
            for it raise ``ValueError`` now rather than at the first batch.
        layout: One sample's dims, the batch dim implied (as in :mod:`fastdata.gpu`).
            ``"CHW"``: images ``(B, C, H, W)``, a channels-last view of the
            ``(B, H, W, C)`` memory (no copy; ``.contiguous()`` makes it planar).
            ``"HWC"``: ``(B, H, W, C)``.
        decode: For encoded image fields (JPEG-mode shards): decode to ``(H, W, 3)`` uint8
            with OpenCV. ``False`` returns the encoded bytes as 1-D uint8 tensors (for
            decoding on the GPU). A ``"cpu"`` :class:`~fastdata.decode.Decoder` (from
            :func:`~fastdata.decode.create_decoder`) decodes each image straight into its
            output: its ``size``, centred or ``random_crop`` box (drawn from its ``seed``),
            ``grayscale`` and ``max_pixels``, JPEGs at the smallest DCT scale that covers
            the box. The dataset's ``num_threads`` and ``on_error`` apply; the transform
            then sees ``size`` images. Any other decoder (``"nvjpeg"``, ``"dali"``, or an
            output on a device) decodes whole batches in the training process: in
            ``__getitems__``, or through :meth:`loader` after its workers, which read the
            encoded bytes (a plain ``DataLoader`` with workers is refused at its first
            batch: ``RuntimeError``); the images come ``(B, C, H, W)`` uint8 on the
            decoder's device, the other fields keep the rows of the samples that decoded,
            the dataset's ``on_error`` applies, and a transform, ``decode_min_side`` or a
            ``mask`` / ``boxes`` field is refused (``ValueError``). Anything else is a
            ``TypeError``. With ``decode=True``, a
            transform that starts with :class:`~fastdata.transforms.RandomResizedCrop`
            (default kernel, no mask fields, no ``decode_min_side``) has its crop run by
            the decode: JPEGs decoded at the smallest DCT scale that covers the box, with
            the boxes drawn after a full decode.
        decode_min_side: Decode JPEGs at 1/2, 1/4 or 1/8 scale when the shorter side stays
            at least this large. Defaults to the transform's ``min_input_side``
            (:class:`~fastdata.transforms.Resize` sets it).
        on_error: Undecodable bytes in a batch: ``"raise"`` a ``DecodeError``, ``"warn"``
            or ``"skip"`` (the batch gets smaller); see :class:`~fastdata.errors.OnError`.
        num_threads: Threads for the per-sample work of a batch; see :attr:`num_threads`.
        in_memory: Refused: a RAM copy of a shard set is
            :meth:`RAMDataset.from_shards` (``ValueError`` naming it).
        cache_dir: Cache folder of a remote set, shared by the processes of a node
            (default: ``$FASTDATA_CACHE_DIR``, else the user cache folder).
        cache_limit: Bytes the cache folder may hold: an int or a string with a unit
            (``"200MB"``, ``"1.5GiB"``); default no limit. It holds at every moment; below
            the largest shard it is refused.
        roles: Field name → role, overriding the manifest's for this dataset (say
            ``{"seg": "mask"}`` for a set written with a field of role ``other``).
        max_pixels: Images whose header claims more pixels (width x height) are refused
            before decoding, like a corrupt file (``on_error`` applies); ``0`` or ``None``:
            no limit. Default: PIL's limit, 89,478,485.
        options: The read options (``layout`` to ``max_pixels`` and ``roles``) as one
            :class:`ReadOptions` value, instead of those keywords. A keyword passed with
            ``options``, even at its default value, is a ``TypeError`` naming it; keywords
            left out take :class:`ReadOptions`' defaults (``layout="CHW"``,
            ``decode=True``, ``on_error="raise"``, ``num_threads=None``, ...).

    Raises:
        TypeError: ``transform`` is not callable, or ``layout`` is not a string.
        ValueError: A field is not stored in the shard set, an argument is invalid, or
            the stored images are too small for ``transform``.
        ShardFormatError: The shard set is missing or unreadable.

    Example:
        >>> ds = ShardDataset("out/", fields=("image", "label"))             # doctest: +SKIP
        >>> loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=0,
        ...                     collate_fn=passthrough_collate)             # doctest: +SKIP
        >>> images, labels = next(iter(loader))  # (64, 3, H, W) uint8, (64,) int64
    """

    def __init__(
        self,
        path: str | Path,
        fields: Sequence[str] = ("image", "label"),
        transform: Callable[..., Any] | None = None,
        *,
        layout: str = NOT_GIVEN,
        decode: bool | Decoder = NOT_GIVEN,
        decode_min_side: int | None = NOT_GIVEN,
        on_error: OnError | str = NOT_GIVEN,
        num_threads: int | None = NOT_GIVEN,
        in_memory: bool = False,
        cache_dir: str | Path | None = None,
        cache_limit: int | str | None = None,
        roles: Mapping[str, str] | None = NOT_GIVEN,
        max_pixels: int | None = NOT_GIVEN,
        options: ReadOptions | None = None,
    ) -> None:
        if isinstance(fields, str) or not fields:
            raise ValueError(f"fields must be a non-empty sequence of field names, got {fields!r}")
        if in_memory:
            raise ValueError(
                "in_memory=True is not a ShardDataset option: load a RAM copy of the shards "
                f"with RAMDataset.from_shards({str(path)!r}, ...)"
            )
        read = ReadOptions.from_arguments(
            options,
            layout=layout,
            decode=decode,
            decode_min_side=decode_min_side,
            on_error=on_error,
            num_threads=num_threads,
            max_pixels=max_pixels,
            roles=roles,
        )
        shards = ShardStore(
            path, known_fields(path, fields), cache_dir=cache_dir, cache_limit=cache_limit
        )
        self.manifest = shards.reader.manifest
        super().__init__(shards, fields=fields, transform=transform, options=read)

    def read_ahead(self, indices: Sequence[int] | Any) -> Iterator[int]:
        """Yield ``indices`` (an epoch's order) while the shards they need are downloaded
        ahead into the cache (a remote set; a local one yields them at once).
        :class:`ShardAwareDistributedSampler` calls it; a custom sampler can too."""
        store = self.store
        if isinstance(store, ShardStore):
            return store.reader.read_ahead(indices)
        return iter(list(indices))

    @property
    def cache_room(self) -> CacheRoom | None:
        """What the cache of a remote set holds (``None``: a local set, or no
        ``cache_limit``); :class:`ShardAwareDistributedSampler` shuffles no more shards
        together than it holds twice over, with a spare."""
        store = self.store
        return store.reader.cache_room if isinstance(store, ShardStore) else None

    @property
    def cache_folder(self) -> CacheFolder | None:
        """The cache folder of a remote set, its ``cache_limit`` and the set's largest
        shard (``None``: a local set): what the ranks of a job compare to share a folder's
        limit (:class:`ShardAwareDistributedSampler`)."""
        store = self.store
        return store.reader.cache_folder if isinstance(store, ShardStore) else None

    def share_cache(self, limit_bytes: int) -> None:
        """Size the read-ahead (and :attr:`cache_room`) by ``limit_bytes``: this process's
        share of a cache folder that ranks of a node share. The sampler calls it."""
        store = self.store
        if isinstance(store, ShardStore):
            store.reader.share_cache(limit_bytes)

    @property
    def class_names(self) -> list[str]:
        """Label ``i`` is ``class_names[i]`` (from the manifest)."""
        return self.manifest.class_names

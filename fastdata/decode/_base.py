"""The one small interface every decoder backend implements, and what they share:
input checking, the pixel limit (``max_pixels``) and the per-batch random draws."""

from __future__ import annotations

import os
import warnings
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch

from fastdata._codec import DEFAULT_MAX_PIXELS, check_pixels, image_size, resolve_max_pixels
from fastdata._draws import UniformDraws, batch_draws
from fastdata._system import usable_cpus
from fastdata.decode._geometry import crop_description, parse_size
from fastdata.errors import DecodeError, OnError
from fastdata.ops import Executor, RandomResizedCrop

DecoderT = TypeVar("DecoderT", bound="Decoder")
EncodedImage = bytes | bytearray | memoryview | np.ndarray | torch.Tensor


class DecodedBatch(NamedTuple):
    """What :meth:`Decoder.decode` returns.

    Attributes:
        images: ``(K, C, H, W)`` uint8 on the decoder's device, channels_last memory format
            (C is 3 for RGB, 1 for grayscale). K is the number of samples that decoded.
        kept: ``(K,)`` int64 CPU tensor: the index in the input batch of each image, so
            labels and masks can follow (``labels[kept]``).
    """

    images: torch.Tensor
    kept: torch.Tensor


def as_byte_array(data: EncodedImage, index: int) -> np.ndarray:
    """One encoded image as a 1-D uint8 NumPy view (no copy for CPU tensors and arrays)."""
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8 or data.dim() != 1 or data.device.type != "cpu":
            raise TypeError(
                f"encoded image {index} must be a 1-D uint8 CPU tensor, got "
                f"{data.dim()}-D {data.dtype} on {data.device}"
            )
        return data.numpy()
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 1:
            raise TypeError(
                f"encoded image {index} must be a 1-D uint8 array, got {data.ndim}-D {data.dtype}"
            )
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        return np.frombuffer(data, dtype=np.uint8)
    raise TypeError(
        f"encoded image {index} must be bytes, a 1-D uint8 array or tensor, "
        f"got {type(data).__name__}"
    )


def check_batch(encoded: Sequence[EncodedImage]) -> list[np.ndarray]:
    """The batch as a list of 1-D uint8 arrays; raises ``TypeError`` naming a bad element."""
    if isinstance(encoded, torch.Tensor | np.ndarray | bytes) or not isinstance(encoded, Sequence):
        raise TypeError(
            "encoded must be a list of encoded images (bytes or 1-D uint8 arrays/tensors), "
            f"got {type(encoded).__name__}"
        )
    return [as_byte_array(item, i) for i, item in enumerate(encoded)]


class SampleKeys(NamedTuple):
    """What a batch's random crops are drawn from, per image: with a seed, image ``k``'s
    draws depend on ``(seed, epoch, indices[k])`` alone (:func:`fastdata._draws.batch_draws`).

    Attributes:
        epoch: The epoch the batch belongs to.
        indices: ``(B,)`` int64 dataset indices of the batch's images, in batch order.
    """

    epoch: int
    indices: np.ndarray


class CheckedBatch(list[np.ndarray]):
    """A checked batch (1-D uint8 arrays, see :func:`check_batch`), what its images are, as
    the caller's users know them (:func:`item_source`), and what their crops are drawn from
    (``None``: the decoder's stream, in batch order)."""

    def __init__(
        self,
        buffers: Iterable[np.ndarray],
        sources: Sequence[str] | None,
        keys: SampleKeys | None = None,
    ) -> None:
        super().__init__(buffers)
        self.sources = sources
        self.keys = keys

    def subset(self, indices: Sequence[int]) -> CheckedBatch:
        """The images at ``indices``, with their sources and keys."""
        sources, keys = self.sources, self.keys
        return CheckedBatch(
            [self[i] for i in indices],
            None if sources is None else [sources[i] for i in indices],
            None if keys is None else SampleKeys(keys.epoch, keys.indices[list(indices)]),
        )


def batch_item(index: int) -> str:
    """The default name of image ``index`` of a batch in a :class:`~fastdata.DecodeError`."""
    return f"batch item {index}"


def item_source(buffers: Sequence[np.ndarray], index: int) -> str:
    """How a :class:`~fastdata.DecodeError` names image ``index`` of a batch a backend
    decodes: the source the caller gave for it (``decode(encoded, sources=...)``), else
    :func:`batch_item`. Every backend's error path names images through this."""
    sources = buffers.sources if isinstance(buffers, CheckedBatch) else None
    return sources[index] if sources is not None else batch_item(index)


def check_sources(sources: Sequence[str] | None, count: int) -> Sequence[str] | None:
    """``sources`` for a batch of ``count`` images: ``None`` or one string per image."""
    if sources is None:
        return None
    if isinstance(sources, str) or not isinstance(sources, Sequence):
        raise TypeError(f"sources must be a list of str or None, got {type(sources).__name__}")
    if len(sources) != count:
        raise ValueError(
            f"sources must name each of the {count} encoded images, got {len(sources)} names"
        )
    for source in sources:
        if not isinstance(source, str):
            raise TypeError(f"sources must be a list of str, got a {type(source).__name__}")
    return sources


def check_keys(keys: tuple[int, Sequence[int]] | None, count: int) -> SampleKeys | None:
    """``keys`` for a batch of ``count`` images: ``None`` or ``(epoch, indices)``, one
    dataset index per image.

    Raises:
        TypeError: ``keys`` is not such a pair of an int and a sequence of ints.
        ValueError: ``indices`` does not hold one index per image.
    """
    if keys is None:
        return None
    problem = f"keys must be None or a pair (epoch, indices) of an int and ints, got {keys!r}"
    if not isinstance(keys, tuple | list) or len(keys) != 2:
        raise TypeError(problem)
    epoch, indices = keys
    array = None if isinstance(indices, str | bytes) else np.asarray(indices)
    if (
        isinstance(epoch, bool)
        or not isinstance(epoch, int | np.integer)
        or array is None
        or array.ndim != 1
        or (array.size > 0 and array.dtype.kind not in "iu")
    ):
        raise TypeError(problem)
    if len(array) != count:
        raise ValueError(
            f"keys must hold one index per encoded image: {count} images, got {len(array)} indices"
        )
    return SampleKeys(int(epoch), array.astype(np.int64))


def resolve_num_threads(num_threads: int | None) -> int:
    """``num_threads``, or when ``None`` the CPUs this process may use divided by the
    processes on this machine under ``torchrun`` (``LOCAL_WORLD_SIZE``), at least 1: each
    rank's decoder must not claim every CPU. Must be positive."""
    if num_threads is None:
        ranks = os.environ.get("LOCAL_WORLD_SIZE", "")
        per_machine = int(ranks) if ranks.isdigit() and int(ranks) > 0 else 1
        return max(1, usable_cpus() // per_machine)
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
    return num_threads


class DecoderRecipe(NamedTuple):
    """How to make a decoder again, in another process: its class and the arguments it was
    made with (see :meth:`Decoder.recipe`). Picklable where the arguments are."""

    kind: type[Decoder]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def make(self) -> Decoder:
        """A new decoder of this class, made with these arguments."""
        return self.kind(*self.args, **self.kwargs)


def channels_last(images_nhwc: torch.Tensor) -> torch.Tensor:
    """``(B, H, W, C)`` contiguous → ``(B, C, H, W)`` view in channels_last memory format."""
    return images_nhwc.permute(0, 3, 1, 2)


class Decoder(ABC):
    """Decodes a batch of encoded images to a fixed-size uint8 batch on one device.

    Call it with a list of encoded images to get the ``(B, C, H, W)`` uint8 batch, or use
    :meth:`decode` to also learn which samples survived ``on_error="skip"|"warn"``.

    Attributes:
        backend: ``"cpu"``, ``"nvjpeg"``, ``"dali"``, or the name a backend of another
            library registered (:func:`~fastdata.decode.register_decoder`).
        size: Output ``(height, width)``.
        random_crop: The :class:`fastdata.ops.RandomResizedCrop` the decoder runs (of its
            ``size``), or ``None`` for a centred crop of the output's aspect ratio (the
            largest that fits) resized to ``size``. Given ``True``, the default one; given
            a CPU transform or device module, the description it holds (its ``op``).
        device: Where the output batch lives.
        on_error: A sample that cannot be decoded: ``"raise"`` a
            :class:`~fastdata.DecodeError`, ``"warn"`` or ``"skip"`` (leave it out of the
            batch); see :class:`~fastdata.errors.OnError`.
        grayscale: One output channel instead of three (RGB).
        max_pixels: An image whose header claims more pixels (width x height) is refused
            before any backend decodes it, as a :class:`~fastdata.DecodeError` of reason
            ``"too_large"`` that ``on_error`` handles; ``None``: no limit (given as ``0``
            or ``None``). Default: PIL's limit, 89,478,485.
        fallbacks: How often work left the backend's fast path, by kind: ``"cpu_decode"``
            (images decoded by the CPU decoder instead), ``"batch_retry"`` (batches that
            failed whole and were retried image by image). Each kind is warned about when
            its count reaches 1, 10, 100, ...

    Backends implement :meth:`_decode` (and may implement :meth:`_decode_stream`); they
    receive only the images within ``max_pixels``, and :meth:`decode` maps their ``kept``
    back to the caller's batch.
    """

    backend: str = ""
    _arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
    # A backend that refuses images over max_pixels itself, from the header it reads to
    # plan the batch (cpu: it also records the refusal among its ``last_errors``).
    checks_max_pixels: ClassVar[bool] = False

    def __new__(cls: type[DecoderT], *args: Any, **kwargs: Any) -> DecoderT:
        decoder = super().__new__(cls)
        # What the decoder was made with, whatever the subclass: its recipe (see recipe()).
        decoder._arguments = (args, dict(kwargs))
        return decoder

    def __init__(
        self,
        size: int | tuple[int, int],
        *,
        random_crop: RandomResizedCrop | Executor | bool | None = None,
        device: torch.device,
        on_error: OnError | str = "raise",
        grayscale: bool = False,
        seed: int | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.max_pixels = resolve_max_pixels(max_pixels)
        self.size = parse_size(size)
        self.random_crop = crop_description(random_crop, self.size)
        self.device = device
        self.on_error = OnError.parse(on_error)
        self.grayscale = bool(grayscale)
        self._random = UniformDraws(seed)
        self.fallbacks: dict[str, int] = {}

    @property
    def channels(self) -> int:
        """Channels of the output: 1 for grayscale, else 3."""
        return 1 if self.grayscale else 3

    def _draws(self, batch: Sequence[np.ndarray] | int) -> np.ndarray:
        """``(B, draws_per_sample)`` uniforms for the random crops of ``batch`` (its images,
        or their number; one column of zeros, unused, if no random crop). With a seed and
        the batch's :class:`SampleKeys` (a :class:`CheckedBatch` given ``keys``), row ``k``
        is drawn from ``(seed, epoch, indices[k])`` alone, as the datasets' CPU transforms
        draw; otherwise from the decoder's stream, in batch order."""
        count = batch if isinstance(batch, int) else len(batch)
        if self.random_crop is None:
            return np.zeros((count, 1))
        columns = self.random_crop.draws_per_sample
        keys = batch.keys if isinstance(batch, CheckedBatch) else None
        if keys is None:
            return self._random.uniform(count, columns)
        with batch_draws(keys.epoch, keys.indices):
            return self._random.uniform(count, columns)

    def recipe(self) -> DecoderRecipe:
        """How to make this decoder again elsewhere: its class and the arguments it was made
        with. A decoder made from it in another process decodes as this one does (same
        backend, size, crop, seed, ``on_error``; a seeded crop keyed by ``(seed, epoch,
        index)`` is the same crop); what each process resolves for itself (``num_threads=
        None``, a bare ``"cuda"`` device) is resolved there, and the stream of unkeyed draws
        starts afresh."""
        args, kwargs = self._arguments
        return DecoderRecipe(type(self), args, dict(kwargs))

    def derive_seed(self) -> int:
        """A seed for another decoder's draws, taken from this one's (advances its stream):
        how workers decoding for this decoder get crops that follow its seed."""
        return int(self._random.uniform(1)[0, 0] * 2**62)

    def count_fallback(self, kind: str, message: str, count: int = 1) -> None:
        """Count ``count`` more fallbacks of ``kind`` (e.g. ``"cpu_decode"``: images decoded by
        the CPU decoder; ``"batch_retry"``: batches retried image by image) in
        :attr:`fallbacks`, and warn when that count reaches 1, 10, 100, ... (``message`` says
        what happened), so that a slow path taken every batch keeps being reported."""
        before = self.fallbacks.get(kind, 0)
        after = before + count
        self.fallbacks[kind] = after
        # a power of ten reached: 0 -> 1+, 9 -> 10+, 99 -> 100+, ...
        if after > before and (before == 0 or len(str(after)) > len(str(before))):
            warnings.warn(
                f"{self.backend} decoder: {message} ({kind} fallbacks so far: {after}; "
                "warned again at 10, 100, 1000, ...; see decoder.fallbacks)",
                RuntimeWarning,
                stacklevel=3,
            )

    def __call__(self, encoded: Sequence[EncodedImage]) -> torch.Tensor:
        """Decode ``encoded`` and return ``(K, C, H, W)`` uint8 images (see :meth:`decode`)."""
        return self.decode(encoded).images

    def decode(
        self,
        encoded: Sequence[EncodedImage],
        *,
        sources: Sequence[str] | None = None,
        keys: tuple[int, Sequence[int]] | None = None,
    ) -> DecodedBatch:
        """Decode a batch of encoded images.

        Args:
            encoded: B encoded images: ``bytes`` or 1-D uint8 NumPy arrays / CPU tensors.
            sources: What each image is, as your users know it (e.g.
                ``"dataset[123] (batch item 7)"``): a :class:`~fastdata.DecodeError` names
                its image so. By default ``"batch item {i}"``.
            keys: ``(epoch, indices)``, the dataset index of each image: with a ``seed``,
                image ``k``'s random crop is drawn from ``(seed, epoch, indices[k])`` alone,
                as the datasets' CPU transforms draw (whatever the batching, the order, or
                the batches decoded before: a resumed run draws the same crops). ``None``:
                from the decoder's stream, in batch order.

        Returns:
            The images that decoded, ``(K, C, H, W)`` uint8 on ``device`` in channels_last
            memory format, and their indices in ``encoded``.

        Raises:
            DecodeError: A sample cannot be decoded (or is over ``max_pixels``) and
                ``on_error="raise"``.
            TypeError: ``encoded`` is not a list of encoded images, ``sources`` not a
                list of str, or ``keys`` not an ``(epoch, indices)`` pair of ints.
            ValueError: ``sources`` or ``keys`` does not hold one entry per image.
        """
        buffers = _checked(encoded, sources, keys)
        allowed = self._within_max_pixels(buffers)
        if allowed is None:
            return self._decode(buffers)
        return _kept_in_batch(self._decode(buffers.subset(allowed)), allowed)

    def decode_stream(
        self,
        batches: Iterable[Sequence[EncodedImage]],
        *,
        sources: Iterable[Sequence[str] | None] | None = None,
        keys: Iterable[tuple[int, Sequence[int]] | None] | None = None,
    ) -> Iterator[DecodedBatch]:
        """Decode ``batches`` in order, one :class:`DecodedBatch` each (what
        :class:`~fastdata.decode.DecodingLoader` calls). Backends that can work ahead (DALI,
        nvJPEG) start a batch before the previous one is collected; by default each batch
        is decoded with :meth:`decode` when it is asked for.

        ``sources`` and ``keys``: one entry per batch each, as :meth:`decode` takes them
        (``None``: the default names; draws from the stream), each read right after its
        batch (so a generator may follow ``batches``). The crop draws are taken in the
        calling thread, in batch order, before a backend works ahead."""
        screened: deque[list[int] | None] = deque()
        names = iter(sources) if sources is not None else None
        batch_keys = iter(keys) if keys is not None else None

        def within_limit() -> Iterator[CheckedBatch]:
            for encoded in batches:
                buffers = _checked(
                    encoded,
                    next(names, None) if names is not None else None,
                    next(batch_keys, None) if batch_keys is not None else None,
                )
                allowed = self._within_max_pixels(buffers)
                screened.append(allowed)
                yield buffers if allowed is None else buffers.subset(allowed)

        for decoded in self._decode_stream(within_limit()):
            allowed = screened.popleft()
            yield decoded if allowed is None else _kept_in_batch(decoded, allowed)

    @abstractmethod
    def _decode(self, buffers: list[np.ndarray]) -> DecodedBatch:
        """The backend's :meth:`decode` of checked buffers (1-D uint8 arrays), all within
        ``max_pixels`` unless the backend :attr:`checks_max_pixels` itself."""

    def _decode_stream(self, batches: Iterable[list[np.ndarray]]) -> Iterator[DecodedBatch]:
        """The backend's :meth:`decode_stream` of checked buffers; by default
        :meth:`_decode` of each batch when it is asked for."""
        for buffers in batches:
            yield self._decode(buffers)

    def _within_max_pixels(self, buffers: list[np.ndarray]) -> list[int] | None:
        """The indices of the images whose header is within ``max_pixels`` (``None``: all
        of them); ``on_error`` handles each other one, before anything is decoded."""
        if self.max_pixels is None or self.checks_max_pixels:
            return None
        allowed: list[int] = []
        for index, data in enumerate(buffers):
            source = item_source(buffers, index)
            try:
                check_pixels(image_size(data), self.max_pixels, source)
            except DecodeError as error:
                error = error if error.source == source else error.with_source(source)
                self.on_error.handle(error, stacklevel=3)
                continue
            allowed.append(index)
        return None if len(allowed) == len(buffers) else allowed

    def close(self) -> None:  # noqa: B027 - backends without resources keep the default
        """Release threads, pipelines or device buffers the backend holds."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, random_crop={self.random_crop}, "
            f"device={self.device}, on_error={self.on_error.value!r}, grayscale={self.grayscale}, "
            f"max_pixels={self.max_pixels})"
        )


def _checked(
    encoded: Sequence[EncodedImage],
    sources: Sequence[str] | None,
    keys: tuple[int, Sequence[int]] | None = None,
) -> CheckedBatch:
    buffers = check_batch(encoded)
    count = len(buffers)
    return CheckedBatch(buffers, check_sources(sources, count), check_keys(keys, count))


def _kept_in_batch(decoded: DecodedBatch, allowed: list[int]) -> DecodedBatch:
    """``decoded`` (of the ``allowed`` images of a batch) with ``kept`` as indices into the
    whole batch."""
    return DecodedBatch(decoded.images, torch.tensor(allowed, dtype=torch.int64)[decoded.kept])

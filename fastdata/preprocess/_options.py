"""``PreprocessOptions``: everything that decides the bytes of the output shards."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fastdata._codec import DEFAULT_MAX_PIXELS, output_size_problem, resolve_max_pixels
from fastdata.errors import OnError
from fastdata.preprocess._transforms import RESIZE_MODES
from fastdata.shards import COMPRESSIONS

STORAGE_MODES = ("raw", "jpeg")
# 64 MiB: ~440 raw 224x224 images per shard, so a few thousand images already make several
# shards for shard-aware sampling and per-shard resume, at the read speed of 1 GiB shards
# (benchmarks/bench_shard_size.py); MosaicML streaming's writers default to 64 MiB too.
DEFAULT_SHARD_BYTES = 64 << 20


@dataclass(frozen=True)
class PreprocessOptions:
    """Options of a preprocessing job. Two runs with equal options over the same input
    write byte-identical shards; how the job runs (workers, progress) is not an option.

    Attributes:
        sizes: Output side(s) in pixels. The first is stored as field ``image`` (and
            ``mask``), each further one as ``image_<side>`` (``mask_<side>``): several
            resolutions in one pass, e.g. for progressive resizing.
        resize: ``"shorter"`` (shorter side to S, centre crop S x S; default), ``"exact"``
            (stretch to S x S), ``"pad"`` (longer side to S, zero-pad to S x S),
            ``"longer"`` (cap the longer side at S, keep the aspect ratio; ``jpeg`` only) or
            ``"keep"`` (the whole image for training-time crops: shorter side to S, aspect
            ratio kept up to 3:1, beyond which the centred 3:1 part is kept; ``raw``
            stores each image at its own size, field kind ``ragged_image``).
        storage: ``"raw"``: fixed-size uint8 ``(N, S, S, C)`` arrays (with ``"keep"``,
            each image's own ``(H_i, W_i, C)`` pixels, values plus offsets). ``"jpeg"``: images
            re-encoded as JPEG (masks as PNG) in a flat blob plus offsets.
        grayscale: Store one channel (``C = 1``) instead of RGB.
        compression: ``None`` (contiguous, memory-mappable), ``"gzip"`` or ``"lzf"``
            (lossless, ``raw`` only).
        jpeg_quality: JPEG quality 1-100 of ``jpeg`` storage.
        shard_bytes: Target size of one shard file in bytes (default 64 MiB).
        on_error: A corrupt, truncated or non-image input: ``"skip"`` it (default) or
            ``"warn"`` (also log it), either way recorded in the manifest's ``skipped``; or
            ``"raise"``: the job stops. A JPEG whose data is
            damaged but decodes (libjpeg warns) counts as such an input, except that
            ``"warn"`` keeps it and logs that it did. See
            :class:`~fastdata.errors.OnError`; the manifest records the policy's name.
        max_pixels: An input whose header claims more pixels (width x height) is refused
            before decoding, like any undecodable input, and so is a dataset item of more
            pixels (default PIL's limit, 89.5 megapixels; ``0`` or ``None``: no limit,
            stored as ``None``). An output size over it is refused at once.

    Raises:
        ValueError: A value out of range, or an output side whose pixels are over
            ``max_pixels`` (or over 65,535).
    """

    sizes: tuple[int, ...] = (224,)
    resize: str = "shorter"
    storage: str = "raw"
    grayscale: bool = False
    compression: str | None = None
    jpeg_quality: int = 90
    shard_bytes: int = DEFAULT_SHARD_BYTES
    on_error: OnError | str = OnError.SKIP
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes) if not isinstance(self.sizes, int) else (self.sizes,)
        object.__setattr__(self, "sizes", sizes)
        if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
            raise ValueError(f"sizes must be one or more positive ints, got {self.sizes!r}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"sizes must be distinct, got {sizes}")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"resize must be one of {RESIZE_MODES}, got {self.resize!r}")
        if self.storage not in STORAGE_MODES:
            raise ValueError(f"storage must be one of {STORAGE_MODES}, got {self.storage!r}")
        if self.resize == "longer" and self.storage == "raw":
            raise ValueError(
                "resize='longer' keeps each image's aspect ratio, so sizes vary; storage='raw' "
                "needs one fixed size: use resize 'shorter', 'exact' or 'pad', or storage='jpeg'"
            )
        if self.compression is not None and self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be None or one of {COMPRESSIONS}, got {self.compression!r}"
            )
        if self.compression is not None and self.storage != "raw":
            raise ValueError(
                f"compression applies to storage='raw' only, got storage={self.storage!r}"
            )
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be an int in 1..100, got {self.jpeg_quality!r}")
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < 1:
            raise ValueError(f"shard_bytes must be a positive int, got {self.shard_bytes!r}")
        object.__setattr__(self, "on_error", OnError.parse(self.on_error))
        object.__setattr__(self, "max_pixels", resolve_max_pixels(self.max_pixels))
        problem = output_size_problem(sizes, self.max_pixels)
        if problem:
            raise ValueError(f"sizes={sizes}: {problem}")

    def to_json(self) -> dict[str, Any]:
        """The options as the manifest records them (what a resume compares)."""
        out = asdict(self)
        out["sizes"] = list(self.sizes)
        out["on_error"] = str(self.on_error)
        return out

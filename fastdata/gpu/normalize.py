"""uint8 → float normalization on the device, and the uint8 → int64 mask companion."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import nn

from fastdata._batch_memory import is_free, storage_use_count
from fastdata._fields import FieldBatch, as_field_batch
from fastdata._layout import check_layout, resolve_layout
from fastdata._planes import cached_planes
from fastdata._roles import IMAGE
from fastdata.gpu._normalize_kernel import normalize_in_one_pass
from fastdata.gpu._normalize_tables import ImageSource, channel_tables, normalize_by_tables
from fastdata.shards import load_manifest

# torch.compiler.is_compiling appeared in torch 2.3; before it, eager code is always taken.
_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _channel_values(name: str, values: Sequence[float] | torch.Tensor) -> torch.Tensor:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise TypeError(f"{name} must be a sequence of floats, one per channel, got {values!r}")
    tensor = torch.as_tensor(values, dtype=torch.float64).flatten().clone()
    if tensor.numel() == 0 or not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} must be a non-empty sequence of finite floats, got {values!r}")
    return tensor


# Images per CPU chunk: about this many elements, so a chunk's float32 copy stays in cache.
_CPU_CHUNK_ELEMENTS = 1 << 20


def _interleaved(images: torch.Tensor) -> bool:
    """A ``(B, C, H, W)`` view of ``(B, H, W, C)`` memory (what a dataset collates), with
    the few channels OpenCV splits."""
    return 1 < images.shape[1] <= 4 and images.permute(0, 2, 3, 1).is_contiguous()


def _planar_chunk(images: torch.Tensor, planar: torch.Tensor) -> torch.Tensor:
    """The ``(n, C, H, W)`` uint8 ``images`` of interleaved memory copied planar into
    ``planar``'s first ``n`` rows: OpenCV's vectorised split (a strided copy in torch
    costs several times more)."""
    pixels = images.permute(0, 2, 3, 1).numpy()
    rows = planar.numpy()
    for k in range(len(pixels)):
        cv2.split(pixels[k], list(rows[k]))
    return planar[: len(pixels)]


def _normalize_on_cpu(
    images: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """``out = images * scale + bias`` per channel, for a uint8 ``(B, C, H, W)`` view on the CPU.

    The one-kernel ``addcmul`` of mixed dtypes runs a scalar loop with a float32 temporary of
    the whole batch on the CPU. Here each chunk of images is converted by a vectorized copy
    into float32 and then scaled and shifted in place, one channel plane at a time, with the
    same float32 constants and the same rounding (``bias + images * scale``); a float16,
    bfloat16 or channels_last output is written from the chunk's planar float32 copy. A
    batch of interleaved memory (``(B, H, W, C)`` seen as ``(B, C, H, W)``) is first split
    into planes by OpenCV, chunk by chunk. Every torch step runs on torch's intra-op threads.
    """
    batch, channels = images.shape[0], images.shape[1]
    per_chunk = max(1, _CPU_CHUNK_ELEMENTS // max(1, images[0].numel()))
    in_place = out.dtype == torch.float32 and out.is_contiguous()
    scratch = None
    if not in_place:
        scratch = torch.empty((min(per_chunk, batch), *images.shape[1:]), dtype=torch.float32)
    planar = None
    if _interleaved(images):
        planar = torch.from_numpy(cached_planes(min(per_chunk, batch), *images.shape[1:]))
    scales = [float(value) for value in scale.tolist()]
    biases = list(bias.unbind())  # 0-dim float32 tensors: the add stays in float32
    for start in range(0, batch, per_chunk):
        source = images[start : start + per_chunk]
        work = out[start : start + per_chunk] if scratch is None else scratch[: len(source)]
        work.copy_(source if planar is None else _planar_chunk(source, planar))
        for channel in range(channels):
            plane = work[:, channel]
            torch.add(biases[channel], plane, alpha=scales[channel], out=plane)
        if scratch is not None:
            out[start : start + per_chunk].copy_(work)
    return out


# Batch outputs kept for reuse on the CPU: the previous one may still be in use (the
# training step holds batch k while batch k + 1 is normalized), the one before is free.
SPARE_CPU_OUTPUTS = 2


class _CpuOutputs:
    """Output memory reused once nothing refers to it. A fresh batch of float32 is tens of
    MB, which the C allocator maps anew for each call (above malloc's mmap threshold) and
    whose every page then faults on the first write: that cost more than the arithmetic
    (docs/benchmarks.md). A memory is handed out again only when nothing but this pool
    refers to it (:func:`fastdata._batch_memory.is_free`: no tensor, view, NumPy array or
    storage object) and it was never moved to shared memory (as a batch sent from a
    DataLoader worker is)."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []  # a byte tensor over each output's memory
        self._lock = threading.Lock()  # one thread at a time takes a memory

    def __reduce__(self) -> tuple[Any, ...]:
        return (_CpuOutputs, ())  # memory is not state: a copy starts empty

    def empty(
        self, shape: torch.Size, dtype: torch.dtype, memory_format: torch.memory_format
    ) -> torch.Tensor:
        """An uninitialised tensor of ``shape``, ``dtype`` and ``memory_format``."""
        layout = torch.empty(shape, dtype=dtype, device="meta", memory_format=memory_format)
        nbytes = layout.numel() * layout.element_size()
        with self._lock:
            # sent to another process (a DataLoader worker's batch), whose readers this
            # count does not see: never reused
            self.kept = [kept for kept in self.kept if not kept.is_shared()]
            for index, kept in enumerate(self.kept):
                if kept.numel() == nbytes and is_free(kept):
                    self.kept.append(self.kept.pop(index))
                    storage = kept.untyped_storage()
                    return torch.empty(0, dtype=dtype).set_(
                        storage, 0, layout.shape, layout.stride()
                    )
        out = torch.empty(shape, dtype=dtype, memory_format=memory_format)
        if storage_use_count is not None:
            with self._lock:
                self.kept.append(torch.empty(0, dtype=torch.uint8).set_(out.untyped_storage()))
                del self.kept[:-SPARE_CPU_OUTPUTS]
        return out


class Normalize(nn.Module):
    """Turn a uint8 image batch into a normalized float batch in one fused expression.

    ``out = (x * value_range / 255 - mean) / std``, computed as one multiply-add
    ``x * scale + bias`` straight from the uint8 input, in float32, written in the output
    dtype and memory format by the same kernel (on CUDA the casts happen inside it: there is
    no float copy of the batch, neither on the host nor on the device; on CUDA it is a
    Triton kernel of wide memory accesses where Triton is installed, ``torch.addcmul``
    otherwise, with one warning; on the CPU each
    output value is looked up in a table per channel of the 256 results of the same float32
    arithmetic, image by image (memory neither planar nor interleaved per image goes
    through in cache-sized chunks of images), into memory of an earlier output that nothing
    refers to any more, up to two batches of it kept: docs/benchmarks.md). ``mean`` and ``std``
    are buffers, so the module moves with ``.to(device)`` and is saved in ``state_dict``.
    Under ``torch.compile`` inductor fuses the same expression into one kernel.

    Args:
        mean: Per-channel mean, on the ``[0, value_range]`` scale.
        std: Per-channel standard deviation, on the same scale; every value > 0.
        value_range: The scale ``mean``/``std`` are given on: ``255.0`` (default) for pixel
            units as in a shard manifest, ``1.0`` for torchvision-style constants such as
            ``(0.485, 0.456, 0.406)``.
        dtype: Output dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``.
        layout: Input layout: ``"CHW"`` (batches ``(B, C, H, W)``), ``"HWC"``
            (``(B, H, W, C)``) or ``"auto"`` (told apart by which dim equals the channel
            count; an ambiguous shape raises ``ValueError``).
        channels_last: Return the output in ``torch.channels_last`` memory format (the
            logical shape is ``(B, C, H, W)`` either way).

    Raises:
        TypeError: ``mean``/``std`` are not sequences, ``dtype`` is not a float dtype above,
            or ``layout`` is not a string.
        ValueError: Lengths differ, a value is not finite, a ``std`` is not > 0,
            ``value_range`` is not > 0, or ``layout`` is unknown.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        mean: Sequence[float] | torch.Tensor,
        std: Sequence[float] | torch.Tensor,
        *,
        value_range: float = 255.0,
        dtype: torch.dtype = torch.float32,
        layout: str = "auto",
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        mean_t, std_t = _channel_values("mean", mean), _channel_values("std", std)
        if mean_t.numel() != std_t.numel():
            raise ValueError(
                f"mean and std need one value per channel each, got {mean_t.numel()} means "
                f"and {std_t.numel()} stds"
            )
        if not bool((std_t > 0).all()):
            raise ValueError(f"std must be > 0 for every channel, got {std_t.tolist()}")
        if not (isinstance(value_range, (int, float)) and math.isfinite(value_range)):
            raise TypeError(f"value_range must be a finite number, got {value_range!r}")
        if value_range <= 0:
            raise ValueError(f"value_range must be > 0, got {value_range!r}")
        if dtype not in OUTPUT_DTYPES:
            raise TypeError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype!r}")
        to_pixels = 255.0 / float(value_range)
        # Stored in pixel units (0-255) whatever scale they were given on.
        self.register_buffer("mean", (mean_t * to_pixels).to(torch.float32))
        self.register_buffer("std", (std_t * to_pixels).to(torch.float32))
        # For the repr, on the host: reading CUDA buffers back would sync the host.
        self._described = (
            [round(v, 3) for v in self.mean.tolist()],
            [round(v, 3) for v in self.std.tolist()],
        )
        self.dtype = dtype
        self.layout = check_layout(layout, auto=True)
        self.channels_last = bool(channels_last)
        self._cpu_outputs = _CpuOutputs()
        self._cpu_tables: tuple[Any, np.ndarray] | None = None
        self._kept_constants: tuple[Any, ...] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cpu_outputs"] = _CpuOutputs()  # memory is not state: not pickled or copied
        state["_kept_constants"] = None  # computed again from the buffers
        return state

    @classmethod
    def from_manifest(
        cls,
        path: str | Path,
        field: str = "image",
        *,
        dtype: torch.dtype = torch.float32,
        layout: str = "auto",
        channels_last: bool = False,
    ) -> Normalize:
        """Build from the per-channel statistics a shard manifest stores for ``field``.

        Args:
            path: The shard folder or its ``index.json``.
            field: The image field whose ``stats`` to use.
            dtype: See the class.
            layout: See the class.
            channels_last: See the class.

        Raises:
            ShardFormatError: The manifest is missing or unreadable.
            ValueError: The manifest has no mean/std statistics for ``field``.
        """
        manifest = load_manifest(path)
        stats = manifest.stats.get(field)
        if not isinstance(stats, dict) or "mean" not in stats or "std" not in stats:
            raise ValueError(
                f"field={field!r} has no mean/std statistics in the manifest at {path}; "
                f"fields with statistics: {sorted(manifest.stats)}"
            )
        return cls(
            stats["mean"], stats["std"], dtype=dtype, layout=layout, channels_last=channels_last
        )

    @property
    def num_channels(self) -> int:
        """The channel count the statistics are for."""
        return int(self.mean.numel())

    def forward(
        self,
        images: torch.Tensor | FieldBatch | Mapping[str, Any],
        roles: Mapping[str, str] | None = None,
    ) -> Any:
        """Normalize a batch.

        Args:
            images: ``(B, C, H, W)`` or ``(B, H, W, C)`` uint8, on any device (the module's
                buffers must be on the same one); or a batch of fields with roles (a
                :class:`~fastdata.transforms.FieldBatch`, or a dict and ``roles``), whose
                ``image`` fields are normalized and the others passed through.
            roles: The roles of a dict batch's fields (default: from their names).

        Returns:
            ``(B, C, H, W)`` tensor of the module's ``dtype`` on the input's device,
            ``channels_last`` in memory when asked, contiguous otherwise (for a batch of
            fields, a :class:`~fastdata.transforms.FieldBatch`).

        Raises:
            TypeError: ``images`` is not a uint8 tensor.
            ValueError: ``images`` is not 4-D, its channel count does not match, or it is on
                another device than the module.
        """
        if isinstance(images, FieldBatch | Mapping):
            batch = as_field_batch(images, roles)
            values = dict(batch.values)
            for name in batch.names(IMAGE):
                values[name] = self.forward(values[name])
            return FieldBatch(values, dict(batch.roles))
        return self._normalize(images)

    def normalize_images_of(
        self, images: torch.Tensor, image_at: ImageSource
    ) -> torch.Tensor | None:
        """Normalize the batch whose ``k``-th uint8 image ``image_at(k)`` makes, in the
        memory of ``images[k]`` (same shape and layout): what a step before this one (a
        mixing step) would write into a batch, made an image at a time and looked up at
        once, so that batch is never written. ``None`` (nothing done) where the CPU lookup
        tables do not take ``images``' memory or device; the caller then normalizes the
        batch it makes.

        Raises:
            TypeError, ValueError: As :meth:`forward`.
        """
        return self._normalize(images, image_at)

    def _normalize(
        self, images: torch.Tensor, image_at: ImageSource | None = None
    ) -> torch.Tensor | None:
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
            got = images.dtype if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(f"images must be a uint8 tensor, got {got}")
        if images.dim() != 4:
            raise ValueError(
                f"images must be 4-D (B, C, H, W) or (B, H, W, C), got shape {tuple(images.shape)}"
            )
        channels = self.num_channels
        layout = resolve_layout(images.shape, self.layout, channels)
        if layout == "HWC":
            images = images.permute(0, 3, 1, 2)
        if images.shape[1] != channels:
            raise ValueError(
                f"images have {images.shape[1]} channels in layout {layout}, but mean/std "
                f"have {channels}"
            )
        if images.device != self.mean.device:
            raise ValueError(
                f"images are on {images.device} but mean/std on {self.mean.device}; "
                f"move the module first: normalize.to({str(images.device)!r})"
            )
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        if image_at is not None and (_is_compiling() or images.device.type != "cpu"):
            return None
        if _is_compiling():
            scale, bias = self._scale_and_bias()
            # Dynamo cannot trace a channels_last `out=`; inductor fuses this into one kernel.
            out = torch.addcmul(bias, images, scale).to(self.dtype)
            return out.contiguous(memory_format=memory_format)
        scale, bias = self._kept_scale_and_bias()
        if images.device.type == "cpu":
            out = self._cpu_outputs.empty(images.shape, self.dtype, memory_format)
            if normalize_by_tables(images, out, self._tables(scale, bias), image_at):
                return out
            if image_at is not None:
                return None
            return _normalize_on_cpu(images, out, scale.flatten(), bias.flatten())
        out = torch.empty(
            images.shape, dtype=self.dtype, device=images.device, memory_format=memory_format
        )
        if normalize_in_one_pass(images, out, scale, bias):
            return out
        # One kernel too: reads uint8, computes in float32, writes `dtype` in the asked
        # layout, through torch's strided loop.
        return torch.addcmul(bias, images, scale, out=out)

    def _scale_and_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, C, 1, 1)`` float32 ``scale`` and ``bias`` of the statistics, on their device
        (float32 even if the module was cast, e.g. by ``model.half()``)."""
        scale = self.std.float().reciprocal().view(1, -1, 1, 1)
        return scale, (-self.mean.float()).view(1, -1, 1, 1) * scale

    def _kept_scale_and_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_scale_and_bias`, kept while the buffers are the same tensors, unchanged
        (version counters and memory): on CUDA a call then launches no kernels for them.
        Not for buffers made under ``torch.inference_mode`` (they keep no version counter),
        nor while a CUDA graph is captured: its kernels run at each replay, so they compute
        the constants from the buffers themselves (and values made during the capture would
        exist only once the graph has run)."""
        mean, std = self.mean, self.std
        untracked = mean.is_inference() or std.is_inference()
        if untracked or (mean.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self._scale_and_bias()
        state = (mean._version, std._version, mean.data_ptr(), std.data_ptr())
        kept = self._kept_constants
        if kept is None or kept[0] is not mean or kept[1] is not std or kept[2] != state:
            kept = self._kept_constants = (mean, std, state, *self._scale_and_bias())
        return kept[3], kept[4]

    def _tables(self, scale: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
        """The per-channel lookup tables of ``scale`` and ``bias`` in the output dtype,
        kept until the statistics change (the CPU buffers are compared by value)."""
        key = (self.dtype, tuple(scale.flatten().tolist()), tuple(bias.flatten().tolist()))
        cached = self._cpu_tables
        if cached is None or cached[0] != key:
            cached = self._cpu_tables = (key, channel_tables(scale, bias, self.dtype))
        return cached[1]

    def extra_repr(self) -> str:
        mean, std = self._described  # as built (a CUDA buffer's .tolist() syncs)
        return (
            f"mean={mean}, std={std}, dtype={self.dtype}, "
            f"layout={self.layout!r}, channels_last={self.channels_last}"
        )


class MaskToLong(nn.Module):
    """Segmentation targets: uint8 class masks → int64, on whatever device they are.

    Args:
        squeeze_channel: Drop a singleton channel dim: ``(B, 1, H, W)`` or ``(B, H, W, 1)``
            → ``(B, H, W)`` (what ``nn.CrossEntropyLoss`` wants).
        ignore_value: A stored value (e.g. 255 for "void") to replace ...
        ignore_index: ... by this one (e.g. -100, CrossEntropyLoss' default ignore index).

    Raises:
        ValueError: Only one of ``ignore_value``/``ignore_index`` is given, or
            ``ignore_value`` is outside 0-255.
    """

    def __init__(
        self,
        *,
        squeeze_channel: bool = True,
        ignore_value: int | None = None,
        ignore_index: int | None = None,
    ) -> None:
        super().__init__()
        if (ignore_value is None) != (ignore_index is None):
            raise ValueError(
                "ignore_value and ignore_index go together, got "
                f"ignore_value={ignore_value!r}, ignore_index={ignore_index!r}"
            )
        if ignore_value is not None and not 0 <= ignore_value <= 255:
            raise ValueError(f"ignore_value must be a uint8 value 0-255, got {ignore_value!r}")
        self.squeeze_channel = bool(squeeze_channel)
        self.ignore_value = ignore_value
        self.ignore_index = ignore_index

    def forward(self, masks: torch.Tensor) -> torch.Tensor:
        """Convert a batch of masks.

        Args:
            masks: ``(B, H, W)``, ``(B, 1, H, W)`` or ``(B, H, W, 1)`` uint8.

        Returns:
            int64 tensor on the input's device; ``(B, H, W)`` when ``squeeze_channel``.

        Raises:
            TypeError: ``masks`` is not a uint8 tensor.
            ValueError: ``masks`` is not 3-D or 4-D with a singleton channel dim.
        """
        if not isinstance(masks, torch.Tensor) or masks.dtype != torch.uint8:
            got = masks.dtype if isinstance(masks, torch.Tensor) else type(masks).__name__
            raise TypeError(f"masks must be a uint8 tensor, got {got}")
        if masks.dim() == 4 and self.squeeze_channel:
            if masks.shape[1] == 1:
                masks = masks[:, 0]
            elif masks.shape[3] == 1:
                masks = masks[..., 0]
            else:
                raise ValueError(
                    f"masks of shape {tuple(masks.shape)} have no singleton channel dim to "
                    "squeeze; pass squeeze_channel=False to keep it"
                )
        elif masks.dim() not in (3, 4):
            raise ValueError(
                f"masks must be (B, H, W) or (B, 1, H, W), got shape {tuple(masks.shape)}"
            )
        out = masks.long()
        if self.ignore_value is not None and self.ignore_index is not None:
            out = out.masked_fill(masks == self.ignore_value, self.ignore_index)
        return out

"""Device-side rates for ``bench_gpu.py``: Normalize, device augmentation, the prefetcher
from pageable batches, and nvJPEG decoding beside bare torchvision and the cpu backend."""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastdata._system import usable_cpus
from fastdata.decode import DecodingLoader, create_decoder
from fastdata.gpu import (
    DeviceMixUp,
    DevicePrefetcher,
    DeviceRandAugment,
    DeviceRandomErasing,
    DeviceRandomHorizontalFlip,
    DeviceRandomResizedCrop,
    Normalize,
)

MEAN = (123.7, 116.3, 103.5)
STD = (58.4, 57.1, 57.4)


def items_per_second(
    fn: Callable[[], object], count: int, *, repeat: int, sync: Callable[[], None] | None
) -> float:
    """``count`` items per call of ``fn``: the best of ``repeat`` timed calls after two
    untimed ones, ``sync`` before each clock read."""
    for _ in range(2):
        fn()
    if sync is not None:
        sync()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        best = min(best, time.perf_counter() - started)
    return count / best


def host_syncs(fn: Callable[[], object]) -> int:
    """Host synchronizations torch reports (sync debug mode) while ``fn`` runs."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def device_rates(device: torch.device, batch: int, repeat: int) -> dict[str, float]:
    """img/s of Normalize (uint8 HWC 224 px to bfloat16 and float32, channels_last, and to
    float32 planar) beside the same expression as one ``torch.addcmul``, device
    flip + RandomResizedCrop (uint8 320 -> 224, channels_last), the same followed by the
    timm recipe's RandAugment, RandomErasing and MixUp (img/s and host syncs per batch), and
    the prefetcher over
    pageable batches (it pins each on the host: what DataLoader(pin_memory=True) saves)."""
    sync = torch.cuda.synchronize
    images = torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8, device=device)
    rates: dict[str, float] = {}
    # the same expression as one torch call, beside it: addcmul reads the uint8 batch and
    # writes the output dtype and memory format itself
    scale = 1 / torch.tensor(STD, device=device).view(1, 3, 1, 1)
    bias = -torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * scale
    for name, dtype, channels_last in (
        ("normalize_bf16", torch.bfloat16, True),
        ("normalize_f32", torch.float32, True),
        ("normalize_f32_planar", torch.float32, False),  # Normalize's defaults
    ):
        module = Normalize(MEAN, STD, dtype=dtype, channels_last=channels_last).to(device)
        rates[f"{name}_img_s"] = items_per_second(
            lambda m=module: [m(images) for _ in range(10)], 10 * batch, repeat=repeat, sync=sync
        )
        memory_format = torch.channels_last if channels_last else torch.contiguous_format

        def addcmul(dtype: torch.dtype = dtype, memory_format: Any = memory_format) -> object:
            view = images.permute(0, 3, 1, 2)
            out = torch.empty(view.shape, dtype=dtype, device=device, memory_format=memory_format)
            return torch.addcmul(bias, view, scale, out=out)

        rates[f"{name}_addcmul_img_s"] = items_per_second(
            lambda: [addcmul() for _ in range(10)], 10 * batch, repeat=repeat, sync=sync
        )
    large = torch.randint(0, 256, (batch, 3, 320, 320), dtype=torch.uint8, device=device)
    large = large.contiguous(memory_format=torch.channels_last)
    flip, crop = DeviceRandomHorizontalFlip(seed=1), DeviceRandomResizedCrop(224, seed=1)
    rates["augment_img_s"] = items_per_second(
        lambda: [crop(flip(large)) for _ in range(5)], 5 * batch, repeat=repeat, sync=sync
    )
    # the timm recipe on the device: RandAugment n2 m9 mstd0.5, RandomErasing 0.25, MixUp
    augment, erase = DeviceRandAugment(2, 9, 0.5, seed=1), DeviceRandomErasing(p=0.25, seed=1)
    mix = DeviceMixUp(alpha=0.8, num_classes=1000, seed=1)
    labels = torch.randint(0, 1000, (batch,), device=device)

    def heavy() -> object:
        return mix(erase(augment(crop(flip(large)))), labels)

    # ten batches a timed call: the device's work on the last one, which the clock read
    # waits for, is then a small part of the time
    rates["augment_heavy_img_s"] = items_per_second(
        lambda: [heavy() for _ in range(10)], 10 * batch, repeat=repeat, sync=sync
    )
    if device.type == "cuda":  # torch counts host syncs of CUDA work only
        rates["augment_heavy_host_syncs"] = host_syncs(heavy)
    pageable = [torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8) for _ in range(2)]
    normalize = Normalize(MEAN, STD, dtype=torch.bfloat16, channels_last=True).to(device)
    prefetcher = DevicePrefetcher(pageable * 5, device, transform=normalize)
    rates["prefetch_pageable_img_s"] = items_per_second(
        lambda: list(prefetcher), 10 * batch, repeat=max(1, repeat // 2), sync=sync
    )
    return rates


def photo_jpegs(count: int, seed: int = 0) -> list[bytes]:
    """ImageNet-like JPEGs: 4:3 and 3:4 photos around 500x375 with texture (60-120 KB)."""
    from PIL import Image  # noqa: PLC0415 - a test dependency, only for the decode rates

    sizes = [(375, 500), (500, 375), (333, 500), (480, 640), (400, 400)]
    out = []
    for i in range(count):
        height, width = sizes[i % len(sizes)]
        rng = np.random.default_rng(seed + i)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        planes = []
        for _ in range(3):
            fy, fx, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.28)
            wave = np.sin(2 * np.pi * (fy * yy / height + fx * xx / width) + phase)
            planes.append(127.5 + 100 * wave)
        rgb = np.stack(planes, axis=-1) + rng.normal(0, 10, (height, width, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def nvjpeg_missing(device: torch.device) -> str | None:
    """Why nvJPEG decoding cannot be timed here, or ``None``."""
    try:
        from torchvision.io import decode_jpeg  # noqa: PLC0415 - optional
    except ImportError as error:
        return f"torchvision not importable ({error})"
    data = torch.frombuffer(bytearray(photo_jpegs(1)[0]), dtype=torch.uint8)
    try:
        decode_jpeg([data], device=device)
    except RuntimeError as error:
        if "not compiled with nvjpeg" in str(error).lower():
            return "this torchvision build has no nvJPEG"
        raise
    return None


def decode_rates(device: torch.device, repeat: int) -> dict[str, Any]:
    """img/s decoding a batch of 64 photos to 224 x 224: the nvjpeg decoder (random and
    centre crops; through DecodingLoader, which decodes a batch ahead on a thread), bare
    ``torchvision.io.decode_jpeg`` (full-size decode only, no crop or resize), and the cpu
    backend on this machine's CPUs; and the host syncs the nvjpeg decoder makes per batch."""
    from torchvision.io import decode_jpeg  # noqa: PLC0415 - present: nvjpeg_missing said so

    sync = torch.cuda.synchronize
    batch = photo_jpegs(64)
    random = create_decoder("nvjpeg", size=224, seed=0, random_crop=True, device=device)
    centre = create_decoder("nvjpeg", size=224, device=device)
    tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in batch]
    labels = torch.arange(64)
    loader = DecodingLoader([(batch, labels)] * 6, random)
    cpu = create_decoder("cpu", size=224, seed=0, random_crop=True)
    result: dict[str, Any] = {
        "batch": 64,
        "mean_jpeg_bytes": sum(map(len, batch)) / len(batch),
        "nvjpeg_random_crop_img_s": items_per_second(
            lambda: random(batch), 64, repeat=repeat, sync=sync
        ),
        "nvjpeg_centre_crop_img_s": items_per_second(
            lambda: centre(batch), 64, repeat=repeat, sync=sync
        ),
        "nvjpeg_loader_lookahead_img_s": items_per_second(
            lambda: list(loader), 6 * 64, repeat=max(1, repeat // 2), sync=sync
        ),
        "torchvision_decode_jpeg_img_s": items_per_second(
            lambda: decode_jpeg(tensors, device=device), 64, repeat=repeat, sync=sync
        ),
        "cpu_backend_img_s": items_per_second(lambda: cpu(batch), 64, repeat=repeat, sync=None),
        "cpu_backend_threads": usable_cpus(),
        "nvjpeg_host_syncs_per_batch": {
            "random_crop": host_syncs(lambda: random(batch)),
            "centre_crop": host_syncs(lambda: centre(batch)),
        },
    }
    return result

"""Normalize on the host then copy float32, versus copy uint8 then normalize on the device;
and the device-side rates of the GPU paths.

For one batch (default 256 x 224 x 224 x 3):
  host part (always): bytes each way would move, host time of a float32 normalize;
  device part (CUDA only): (a) host normalize + float32 copy versus (b) uint8 copy + device
  normalize, time per batch and ratio, on equal terms twice: each path pinning what it
  copies every call, and each copying from a buffer pinned beforehand; and how much of the
  transfer ``DevicePrefetcher`` (built once, outside the timed region) hides behind a
  synthetic compute step: of the copy alone (the device Normalize then runs in the step;
  target >= 90%), and of copy + Normalize on the prefetcher's side stream. The copy runs
  on a copy engine, beside the compute; the Normalize is a kernel on the same SMs as the
  compute, so behind compute-bound work its time shows wherever it runs;
  rates (CUDA only): Normalize beside the same expression as one ``torch.addcmul``, device
  flip + RandomResizedCrop, the prefetcher from pageable batches, and (torchvision with
  nvJPEG present) the nvjpeg decoder on a batch of 64 photos (random and centre crops,
  through DecodingLoader's look-ahead, host syncs per batch) beside bare
  ``torchvision.io.decode_jpeg`` and the cpu backend.

    python benchmarks/bench_gpu.py [--batch 256] [--size 224] [--steps 50] [--repeat 5]
        [--skip-decode]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_rates import decode_rates, device_rates, nvjpeg_missing
from _harness import add_publish_argument, save

from fastdata._system import format_bytes
from fastdata.gpu import DevicePrefetcher, Normalize

MEAN = (123.7, 116.3, 103.5)
STD = (58.4, 57.1, 57.4)


def time_call(
    fn: Callable[[], object],
    *,
    repeat: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Seconds per call of ``fn``: median and minimum of ``repeat`` timed calls.

    ``sync`` (``torch.cuda.synchronize``) runs before each clock read, so that queued
    device work is counted.
    """
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "min_s": min(times)}


def host_part(images: torch.Tensor, repeat: int) -> dict[str, Any]:
    """Bytes per batch for each path and the host cost of normalizing to float32."""
    normalize = Normalize(MEAN, STD, layout="HWC")
    float_bytes = images.numel() * 4
    timing = time_call(lambda: normalize(images), repeat=repeat)
    return {
        "uint8_bytes": images.numel(),
        "float32_bytes": float_bytes,
        "bytes_ratio": float_bytes / images.numel(),
        "host_normalize_s": timing["median_s"],
        "host_normalize_min_s": timing["min_s"],
    }


def _synthetic_step(work: torch.Tensor, matmuls: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(batch: torch.Tensor) -> torch.Tensor:
        # Depends on the batch, so it cannot start before the batch is on the device.
        acc = work + batch[0, 0, 0, :1].float()
        for _ in range(matmuls):
            acc = torch.tanh(acc @ work)
        return acc

    return step


def copy_paths(
    images: torch.Tensor,
    device: torch.device,
    normalize_host: Normalize,
    normalize_dev: Normalize,
    pin: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, Callable[[], torch.Tensor]]:
    """The two paths, each on the same terms, in two settings.

    ``*_pin_per_call``: from the pageable host batch, each path pins what it copies, every
    call (what ``DataLoader(pin_memory=True)`` does per batch): float32 for (a), uint8 for
    (b). ``*_prepinned``: each path copies from a buffer of its own dtype pinned beforehand
    (the host normalize of (a) still runs every call).
    """
    pinned_u8 = pin(images)
    pinned_f32 = pin(normalize_host(images))

    def float_pin_per_call() -> torch.Tensor:  # (a) normalize on the host, pin, copy float32
        return pin(normalize_host(images)).to(device, non_blocking=True)

    def uint8_pin_per_call() -> torch.Tensor:  # (b) pin, copy uint8, normalize on the device
        return normalize_dev(pin(images).to(device, non_blocking=True))

    def float_prepinned() -> torch.Tensor:
        normalize_host(images)  # the host work of (a); its bytes are those of pinned_f32
        return pinned_f32.to(device, non_blocking=True)

    def uint8_prepinned() -> torch.Tensor:
        return normalize_dev(pinned_u8.to(device, non_blocking=True))

    return {
        "float_pin_per_call": float_pin_per_call,
        "uint8_pin_per_call": uint8_pin_per_call,
        "float_prepinned": float_prepinned,
        "uint8_prepinned": uint8_prepinned,
    }


def overlap_part(
    batches: list[torch.Tensor],
    device: torch.device,
    normalize_dev: Normalize,
    step: Callable[[torch.Tensor], torch.Tensor],
    *,
    steps: int,
    repeat: int,
    sync: Callable[[], None] | None,
) -> dict[str, float]:
    """Compute alone, copy + normalize then compute serially, and the same with the copy
    in flight on ``DevicePrefetcher``'s side stream; the fraction of copy + normalize time
    hidden. The prefetcher is built once, before any timing (its stream and first
    allocations are not timed; the warm-up pass fills the allocator's cache)."""
    device_batch = normalize_dev(batches[0].to(device))
    loader = [batches[i % len(batches)] for i in range(steps)]
    prefetcher = DevicePrefetcher(loader, device, transform=normalize_dev)

    def compute_only() -> None:
        for _ in range(steps):
            step(device_batch)

    def serial() -> None:  # copy + normalize then compute, one after the other
        for host in loader:
            step(normalize_dev(host.to(device)))

    def prefetched() -> None:
        for batch in prefetcher:
            step(batch)

    compute = time_call(compute_only, repeat=repeat, sync=sync)["median_s"]
    serial_s = time_call(serial, repeat=repeat, sync=sync)["median_s"]
    overlap_s = time_call(prefetched, repeat=repeat, sync=sync)["median_s"]
    transfer = serial_s - compute
    exposed = max(0.0, overlap_s - compute)
    hidden = 1.0 - exposed / transfer if transfer > 0 else float("nan")
    return {
        "steps": steps,
        "compute_only_s": compute,
        "serial_s": serial_s,
        "prefetched_s": overlap_s,
        "hidden_fraction": max(0.0, min(1.0, hidden)),
    }


def copy_overlap_part(
    batches: list[torch.Tensor],
    device: torch.device,
    normalize_dev: Normalize,
    step: Callable[[torch.Tensor], torch.Tensor],
    *,
    steps: int,
    repeat: int,
    sync: Callable[[], None] | None,
) -> dict[str, float]:
    """As :func:`overlap_part`, with only the copy on the prefetcher's side stream: every
    step normalizes on the consumer's stream, so the fraction is the copy's alone."""
    device_batch = batches[0].to(device)
    loader = [batches[i % len(batches)] for i in range(steps)]
    prefetcher = DevicePrefetcher(loader, device)

    def compute_only() -> None:
        for _ in range(steps):
            step(normalize_dev(device_batch))

    def serial() -> None:
        for host in loader:
            step(normalize_dev(host.to(device)))

    def prefetched() -> None:
        for batch in prefetcher:
            step(normalize_dev(batch))

    compute = time_call(compute_only, repeat=repeat, sync=sync)["median_s"]
    serial_s = time_call(serial, repeat=repeat, sync=sync)["median_s"]
    overlap_s = time_call(prefetched, repeat=repeat, sync=sync)["median_s"]
    transfer = serial_s - compute
    hidden = 1.0 - max(0.0, overlap_s - compute) / transfer if transfer > 0 else float("nan")
    return {
        "steps": steps,
        "compute_and_normalize_s": compute,
        "serial_s": serial_s,
        "prefetched_s": overlap_s,
        "hidden_fraction": max(0.0, min(1.0, hidden)),
    }


def device_part(images: torch.Tensor, steps: int, repeat: int) -> dict[str, Any]:
    """Copy/normalize timings on the current CUDA device and the prefetcher's overlap."""
    device = torch.device("cuda", torch.cuda.current_device())
    sync = torch.cuda.synchronize
    normalize_host = Normalize(MEAN, STD, layout="HWC")
    normalize_dev = Normalize(MEAN, STD, layout="HWC").to(device)
    paths = copy_paths(images, device, normalize_host, normalize_dev, torch.Tensor.pin_memory)
    timed = {name: time_call(fn, repeat=repeat, sync=sync) for name, fn in paths.items()}
    pinned_u8 = images.pin_memory()
    pinned_f32 = normalize_host(images).pin_memory()
    copy_f32 = time_call(lambda: pinned_f32.to(device, non_blocking=True), repeat=repeat, sync=sync)
    copy_u8 = time_call(lambda: pinned_u8.to(device, non_blocking=True), repeat=repeat, sync=sync)

    # Synthetic compute sized to about twice the uint8 copy + normalize, so it can hide it.
    b = timed["uint8_prepinned"]
    work = torch.randn(2048, 2048, device=device) / 2048**0.5
    step = _synthetic_step(work, 1)
    one = time_call(lambda: step(normalize_dev(pinned_u8.to(device))), repeat=repeat, sync=sync)
    matmuls = max(1, round(2 * b["median_s"] / max(one["median_s"] - b["median_s"], 1e-6)))
    batches = [pinned_u8.clone().pin_memory() for _ in range(4)]
    overlap = overlap_part(
        batches,
        device,
        normalize_dev,
        _synthetic_step(work, matmuls),
        steps=steps,
        repeat=repeat,
        sync=sync,
    )
    copy_overlap = copy_overlap_part(
        batches,
        device,
        normalize_dev,
        _synthetic_step(work, matmuls),
        steps=steps,
        repeat=repeat,
        sync=sync,
    )
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(device)}
    for setting in ("pin_per_call", "prepinned"):
        a_s, b_s = timed[f"float_{setting}"]["median_s"], timed[f"uint8_{setting}"]["median_s"]
        result[setting] = {"float_path_s": a_s, "uint8_path_s": b_s, "speedup_uint8": a_s / b_s}
    result.update(
        {
            "float_path": "host normalize + non_blocking copy of float32",
            "uint8_path": "non_blocking copy of uint8 + device Normalize",
            "copy_float32_s": copy_f32["median_s"],
            "copy_uint8_s": copy_u8["median_s"],
            "copy_float32_GBps": pinned_f32.numel() * 4 / copy_f32["median_s"] / 1e9,
            "copy_uint8_GBps": pinned_u8.numel() / copy_u8["median_s"] / 1e9,
            "overlap": {**overlap, "matmuls_per_step": matmuls},
            "copy_overlap": {**copy_overlap, "matmuls_per_step": matmuls},
        }
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=50, help="steps in the overlap test")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--skip-decode", action="store_true", help="leave out the nvJPEG decode rates"
    )
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.batch, args.size, args.size, 3), dtype=torch.uint8)
    started = time.perf_counter()
    results: dict[str, Any] = {"batch": args.batch, "size": args.size}
    results["host"] = host = host_part(images, args.repeat)
    print(
        f"batch {args.batch}x{args.size}x{args.size}x3: uint8 {format_bytes(host['uint8_bytes'])}"
        f" vs float32 {format_bytes(host['float32_bytes'])} to move ({host['bytes_ratio']:.0f}x);"
        f" host float32 normalize {host['host_normalize_s'] * 1e3:.1f} ms/batch"
        f" (uint8 path: 0 ms on the host)"
    )
    if torch.cuda.is_available():
        results["device"] = dev = device_part(images, args.steps, args.repeat)
        ov = dev["overlap"]
        for setting in ("pin_per_call", "prepinned"):
            row = dev[setting]
            print(
                f"{dev['device']} ({setting.replace('_', ' ')}): (a) host normalize + float32"
                f" copy {row['float_path_s'] * 1e3:.1f} ms vs (b) uint8 copy + device normalize"
                f" {row['uint8_path_s'] * 1e3:.2f} ms per batch = {row['speedup_uint8']:.1f}x"
            )
        print(
            f"copies of pinned buffers: float32 {dev['copy_float32_s'] * 1e3:.2f} ms,"
            f" uint8 {dev['copy_uint8_s'] * 1e3:.2f} ms"
        )
        cov = dev["copy_overlap"]
        print(
            f"prefetcher hides {cov['hidden_fraction']:.0%} of the copy behind compute (target"
            f" >= 90%; Normalize in the step), {ov['hidden_fraction']:.0%} of copy+normalize on"
            f" its side stream (compute {ov['compute_only_s'] * 1e3:.1f} ms, serial"
            f" {ov['serial_s'] * 1e3:.1f} ms, prefetched {ov['prefetched_s'] * 1e3:.1f} ms for"
            f" {ov['steps']} steps; Normalize shares the SMs with the compute)"
        )
        device = torch.device("cuda", torch.cuda.current_device())
        results["rates"] = rates = device_rates(device, args.batch, args.repeat)
        print(
            "rates: Normalize uint8 HWC -> "
            + ", ".join(
                f"{label} {rates[f'{key}_img_s']:,.0f} img/s"
                f" ({rates[f'{key}_img_s'] / rates[f'{key}_addcmul_img_s']:.2f}x torch.addcmul)"
                for label, key in (
                    ("bf16 channels_last", "normalize_bf16"),
                    ("float32 channels_last", "normalize_f32"),
                    ("float32 planar", "normalize_f32_planar"),
                )
            )
            + "; device flip +"
            f" RandomResizedCrop 320->224 {rates['augment_img_s']:,.0f} img/s; + RandAugment n2 m9,"
            f" RandomErasing 0.25, MixUp {rates['augment_heavy_img_s']:,.0f} img/s"
            f" ({rates.get('augment_heavy_host_syncs')} host syncs a batch); prefetcher from"
            f" pageable batches {rates['prefetch_pageable_img_s']:,.0f} img/s"
        )
        missing = "--skip-decode" if args.skip_decode else nvjpeg_missing(device)
        if missing is None:
            results["decode"] = dec = decode_rates(device, args.repeat)
            print(
                f"decode 64 photos to 224 (mean JPEG {dec['mean_jpeg_bytes'] / 1e3:.0f} KB):"
                f" nvjpeg random crop {dec['nvjpeg_random_crop_img_s']:,.0f} img/s, centre crop"
                f" {dec['nvjpeg_centre_crop_img_s']:,.0f}, through DecodingLoader (look-ahead)"
                f" {dec['nvjpeg_loader_lookahead_img_s']:,.0f}; bare torchvision decode_jpeg"
                f" {dec['torchvision_decode_jpeg_img_s']:,.0f}; cpu backend"
                f" {dec['cpu_backend_img_s']:,.0f} on {dec['cpu_backend_threads']} CPUs;"
                f" nvjpeg host syncs per batch {dec['nvjpeg_host_syncs_per_batch']}"
            )
        else:
            results["decode"] = None
            print(f"decode rates not measured: {missing}")
    else:
        results["device"] = None
        print("no CUDA device: the device half (copy, device normalize, overlap) was not run")
    results["elapsed_s"] = time.perf_counter() - started
    results["cuda_device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    save("gpu", results, publish=args.publish)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The resize kernel of the CPU transforms, and RAMDataset over JPEG files against its
decode + resize bound, on one thread.

Photos: scikit-image's bundled ones, rescaled to 500x375 and 375x500 (ImageNet-like) and
encoded as JPEG (quality 90) in RAM. Two measurements, back to back in one run:

- kernels: milliseconds per image of ``Resize(256)`` (shorter side to 256) with OpenCV
  ``INTER_AREA``, ``INTER_LINEAR`` (no antialiasing), fastdata's antialiased kernel
  (``fastdata._resize``: 3-tap low-pass + bilinear, area from 2.75x or at whole factors
  from 2x) and PIL's antialiased bilinear, with each one's mean absolute difference from
  PIL's (levels of 255);
- loaders: images/s of ``RAMDataset`` + ``Resize(256)`` + ``CenterCrop(224)`` with the
  default kernel and with ``interpolation=INTER_AREA``, and of the bound: simplejpeg
  decode + bilinear resize to 256 + centre crop 224, in a plain loop; reported as ratios
  to the bound (the machine may be shared: compare ratios, not absolute figures).

    python benchmarks/bench_resize.py              # 64 photos, >= 2 s per measurement
    python benchmarks/bench_resize.py --quick
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import simplejpeg
import torch
from _harness import add_publish_argument, images_per_second, save
from PIL import Image
from skimage import data as photo_data  # the demo extra

from fastdata import RAMDataset
from fastdata._resize import resize_image
from fastdata.transforms import CenterCrop, Compose, Resize

SIDE, CROP = 256, 224


# scikit-image's bundled photographs (bench_ram_jpeg.py uses them too)
PHOTO_NAMES = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
)


def _photos(count: int) -> list[np.ndarray]:
    sources = []
    for name in PHOTO_NAMES:
        image = getattr(photo_data, name)()
        sources.append(np.ascontiguousarray(image[..., :3]))
    photos = []
    for k in range(count):
        source = sources[k % len(sources)]
        size = (500, 375) if k % 2 == 0 else (375, 500)
        photos.append(cv2.resize(source, size, interpolation=cv2.INTER_AREA))
    return photos


def _shorter_to(image: np.ndarray, side: int) -> tuple[int, int]:
    h, w = image.shape[:2]
    return (side, round(w * side / h)) if h <= w else (round(h * side / w), side)


def _kernels(photos: list[np.ndarray], min_seconds: float) -> dict[str, dict[str, float]]:
    def pil(image: np.ndarray, width: int, height: int) -> np.ndarray:
        resized = Image.fromarray(image).resize((width, height), Image.Resampling.BILINEAR)
        return np.asarray(resized)

    kernels: dict[str, Callable[[np.ndarray, int, int], np.ndarray]] = {
        "opencv_area": lambda im, w, h: cv2.resize(im, (w, h), interpolation=cv2.INTER_AREA),
        "opencv_linear": lambda im, w, h: cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR),
        "fastdata_antialiased": resize_image,
        "pil_bilinear_antialiased": pil,
    }
    results = {}
    for name, kernel in kernels.items():
        count, started = 0, time.perf_counter()
        while count == 0 or time.perf_counter() - started < min_seconds:
            for photo in photos:
                height, width = _shorter_to(photo, SIDE)
                kernel(photo, width, height)
            count += len(photos)
        ms = (time.perf_counter() - started) / count * 1e3
        differences = []
        for photo in photos:
            height, width = _shorter_to(photo, SIDE)
            got = kernel(photo, width, height).astype(np.int16)
            differences.append(np.abs(got - pil(photo, width, height)).mean())
        results[name] = {"ms_per_image": ms, "mean_abs_diff_from_pil": float(np.mean(differences))}
    return results


def _bound(jpegs: list[bytes]) -> Callable[[], int]:
    def one_pass() -> int:
        for data in jpegs:
            image = simplejpeg.decode_jpeg(data, fastdct=True)
            height, width = _shorter_to(image, SIDE)
            resized = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
            top, left = (height - CROP) // 2, (width - CROP) // 2
            np.ascontiguousarray(resized[top : top + CROP, left : left + CROP])
        return len(jpegs)

    return one_pass


def _loaders(photos: list[np.ndarray], workdir: Path, min_seconds: float) -> dict[str, Any]:
    paths = []
    workdir.mkdir(parents=True, exist_ok=True)
    for k, photo in enumerate(photos):
        buffer = io.BytesIO()
        Image.fromarray(photo).save(buffer, format="JPEG", quality=90)
        path = workdir / f"{k:04d}.jpg"
        path.write_bytes(buffer.getvalue())
        paths.append(path)
    jpegs = [path.read_bytes() for path in paths]
    bound_pass = _bound(jpegs)

    def bound_rate() -> float:
        bound_pass()
        count, started = 0, time.perf_counter()
        while count == 0 or time.perf_counter() - started < min_seconds:
            count += bound_pass()
        return count / (time.perf_counter() - started)

    def dataset_rate(interpolation: int | None) -> float:
        transform = Compose([Resize(SIDE, interpolation=interpolation), CenterCrop(CROP)])
        dataset = RAMDataset(
            paths, list(range(len(paths))), transform, num_threads=1, show_progress=False
        )
        return images_per_second(dataset.loader(batch_size=32), min_seconds=min_seconds)

    bound = bound_rate()
    rates = {
        "bound_simplejpeg_linear_resize_crop": bound,
        "ramdataset_antialiased": dataset_rate(None),
        "ramdataset_opencv_area": dataset_rate(cv2.INTER_AREA),
    }
    ratios = {name: rate / bound for name, rate in rates.items()}
    return {"images_per_second": rates, "ratio_to_bound": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="0.5 s per measurement")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fastdata-bench-resize"))
    add_publish_argument(parser)
    args = parser.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    min_seconds = 0.5 if args.quick else 2.0
    photos = _photos(args.num_images)
    kernels = _kernels(photos, min_seconds)
    for name, row in kernels.items():
        print(
            f"{name:26s} {row['ms_per_image']:.3f} ms/image, "
            f"{row['mean_abs_diff_from_pil']:.2f} levels from PIL's"
        )
    loaders = _loaders(photos, args.workdir, min_seconds)
    for name, rate in loaders["images_per_second"].items():
        ratio = loaders["ratio_to_bound"][name]
        print(f"{name:38s} {rate:8.0f} img/s  {ratio:.2f} of the bound")
    save(
        "resize",
        {"kernels": kernels, "loaders": loaders, "num_images": args.num_images},
        partial=args.quick,
        publish=args.publish,
    )


if __name__ == "__main__":
    main()

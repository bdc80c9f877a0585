"""Generate an ImageFolder tree of JPEGs that look (and decode) like real photos.

Every image is a random crop of one of the photographs that scikit-image ships, rescaled
to about ImageNet's typical 500x375 (landscape or portrait), colour-jittered, given a
little sensor-like noise and saved as a JPEG of quality 75-95. Image ``i`` depends only on
``(seed, i)``, so the tree is identical whatever the number of worker processes.

Usage::

    python tools/make_sample_dataset.py OUT --num-images 4000 --num-classes 10 --seed 0

or, from Python (tests load this file with importlib; see ``tests/conftest.py``)::

    make_sample_dataset(root, num_images=24, image_size=(64, 48))   # tiny variant
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from fastdata._optional import import_optional

# Typical ImageNet sizes (width, height); portrait variants are drawn too.
_SIZES = ((500, 375), (500, 333), (500, 400), (480, 360), (450, 338), (500, 500))
_NOISE_SIDE = 640
_MIN_PHOTO_SIDE = 256
# The real photographs among scikit-image's bundled images (no charts, logos or text).
_PHOTO_NAMES = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "chelsea.png",
    "clock_motion.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "moon.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "retina.jpg",
    "rocket.jpg",
)


@functools.cache
def _photos() -> tuple[np.ndarray, ...]:
    """The colour and grey photographs bundled in scikit-image's data folder, as BGR uint8."""
    skimage = import_optional("skimage", "the sample dataset (made from its photographs)")
    data_dir = Path(skimage.__file__).parent / "data"
    photos = []
    for name in _PHOTO_NAMES:
        path = data_dir / name
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is not None and min(image.shape[:2]) >= _MIN_PHOTO_SIDE:
            photos.append(image)
    if not photos:
        raise RuntimeError(f"no photographs found in scikit-image's data folder {data_dir}")
    return tuple(photos)


@functools.cache
def _noise(side: int) -> np.ndarray:
    """A fixed ``(side, side, 3)`` int16 field of mild Gaussian noise: cheap 'sensor grain'."""
    rng = np.random.default_rng(1234)
    return rng.normal(0.0, 4.0, (side, side, 3)).round().astype(np.int16)


def make_image(seed: int, index: int, image_size: tuple[int, int] | None = None) -> bytes:
    """The JPEG bytes of sample ``index`` under ``seed``.

    Args:
        seed: Dataset seed.
        index: Sample number; with ``seed`` it fixes everything about the image.
        image_size: ``(width, height)`` of every image; ``None`` draws ImageNet-like sizes.

    Returns:
        JPEG-encoded bytes, quality 75-95.
    """
    rng = np.random.default_rng([seed, index])
    photos = _photos()
    photo = photos[int(rng.integers(len(photos)))]
    if image_size is None:
        width, height = _SIZES[int(rng.integers(len(_SIZES)))]
        if rng.random() < 0.25:
            width, height = height, width
    else:
        width, height = image_size
    # Random crop covering 30-100 % of the photo's area at the output aspect ratio.
    ph, pw = photo.shape[:2]
    area = rng.uniform(0.3, 1.0) * ph * pw
    crop_w = int(min(pw, round(np.sqrt(area * width / height))))
    crop_h = int(min(ph, round(crop_w * height / width)))
    y = int(rng.integers(ph - crop_h + 1))
    x = int(rng.integers(pw - crop_w + 1))
    shrinking = crop_w * crop_h > width * height
    image = cv2.resize(
        photo[y : y + crop_h, x : x + crop_w],
        (width, height),
        interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC,
    )
    if rng.random() < 0.5:
        image = cv2.flip(image, 1)
    # Colour jitter: saturation, then per-channel gain and offset around mid-grey (a LUT).
    saturation = rng.uniform(0.6, 1.4)
    gray = cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), cv2.COLOR_GRAY2BGR)
    image = cv2.addWeighted(image, saturation, gray, 1.0 - saturation, 0.0)
    gains = rng.uniform(0.8, 1.2) * rng.uniform(0.9, 1.1, 3)
    offsets = rng.uniform(-20, 20) + rng.uniform(-8, 8, 3)
    levels = np.arange(256, dtype=np.float64)[:, None]
    lut = np.clip((levels - 128.0) * gains + 128.0 + offsets, 0, 255).astype(np.uint8)
    image = cv2.LUT(image, lut.reshape(256, 1, 3))
    # Grain: a random window of a fixed noise field.
    side = _NOISE_SIDE if max(height, width) <= _NOISE_SIDE else 2 * max(height, width)
    noise_y = int(rng.integers(side - height + 1))
    noise_x = int(rng.integers(side - width + 1))
    grain = _noise(side)[noise_y : noise_y + height, noise_x : noise_x + width]
    image = cv2.add(image, grain, dtype=cv2.CV_8U)
    quality = int(rng.integers(75, 96))
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError(f"JPEG encoding failed for sample {index}")
    return encoded.tobytes()


def _write_one(
    root: Path, seed: int, num_classes: int, image_size: tuple[int, int] | None, index: int
) -> int:
    path = root / f"class_{index % num_classes:03d}" / f"img_{index:06d}.jpg"
    data = make_image(seed, index, image_size)
    path.write_bytes(data)
    return len(data)


def make_sample_dataset(
    root: str | Path,
    num_images: int,
    num_classes: int = 10,
    seed: int = 0,
    *,
    image_size: tuple[int, int] | None = None,
    workers: int | None = None,
) -> list[Path]:
    """Write an ImageFolder tree ``root/class_XXX/img_NNNNNN.jpg``.

    Sample ``i`` goes to class ``i % num_classes``. The output depends only on
    ``num_images``, ``num_classes``, ``seed`` and ``image_size``.

    Args:
        root: Output folder (created; existing files of the same names are overwritten).
        num_images: How many JPEGs to write (>= 1).
        num_classes: How many class folders (1..num_images).
        seed: Randomness seed.
        image_size: ``(width, height)`` of every image (e.g. ``(64, 48)`` for tests);
            ``None`` draws ImageNet-like sizes around 500x375.
        workers: Processes to use; ``None`` uses every CPU this process may use, ``1``
            stays in this process.

    Returns:
        The written paths, in sample order.
    """
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images}")
    if not 1 <= num_classes <= num_images:
        raise ValueError(f"num_classes must be in 1..num_images ({num_images}), got {num_classes}")
    root = Path(root)
    for label in range(num_classes):
        (root / f"class_{label:03d}").mkdir(parents=True, exist_ok=True)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    _photos(), _noise(_NOISE_SIDE)  # load once here; the threads share them
    work = functools.partial(_write_one, root, seed, num_classes, image_size)
    if workers <= 1 or num_images < 64:
        for index in range(num_images):
            work(index)
    else:
        # Threads, not forked processes: OpenCV releases the GIL in the heavy calls, and a fork
        # of a process whose OpenCV thread pool has run can deadlock the children.
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, range(num_images)))
    return [root / f"class_{i % num_classes:03d}" / f"img_{i:06d}.jpg" for i in range(num_images)]


def ensure_sample_dataset(
    root: str | Path, num_images: int, num_classes: int = 10, seed: int = 0
) -> Path:
    """The sample tree at ``root``, generated only when it does not hold ``num_images``
    JPEGs already (demo and benchmarks reuse it between runs)."""
    root = Path(root)
    marker = root / f".complete-{num_images}-{num_classes}-{seed}"
    if not marker.exists():
        make_sample_dataset(root, num_images, num_classes, seed)
        marker.touch()
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="output folder (ImageFolder layout)")
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--size",
        type=int,
        nargs=2,
        metavar=("W", "H"),
        default=None,
        help="fixed size of every image (default: ImageNet-like, ~500x375)",
    )
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    paths = make_sample_dataset(
        args.out,
        args.num_images,
        args.num_classes,
        args.seed,
        image_size=tuple(args.size) if args.size else None,
        workers=args.workers,
    )
    elapsed = time.perf_counter() - started
    total = sum(p.stat().st_size for p in paths)
    print(
        f"wrote {len(paths)} JPEGs ({total / 2**20:.1f} MiB) in {args.num_classes} classes "
        f"to {args.out} in {elapsed:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the heavy recipe's CPU time goes, op by op, on raw uint8 shards.

The timm recipe of ``bench_augment.py`` (RandomResizedCrop 224 + flip + RandAugment n2 m9
mstd0.5 + RandomErasing 0.25, then MixUp/CutMix and ``gpu.Normalize`` on the collated
batch), each op run alone on one thread in this process on batches of 64 rows of the
shards: CPU time per image and minor page faults per image (memory mapped afresh), best of
``--repeats`` passes. Then, in one more pass, RandAugment's kernels timed inside it: the
time per image a kernel ran on, and per image of the batch (how often the policy draws
it). Last, each of RandAugment's 15 ops alone on every image of a cropped batch at the
recipe's magnitude (best of ``--op-repeats``): CPU ms per batch, and that cost weighted by
how often the policy draws the op (``num_ops * p / 15`` per image), the ops ranked by it.
One command::

    PYTHONPATH=. python benchmarks/bench_augment_ops.py --num-images 1000
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import add_publish_argument, save
from bench_augment import MEAN, NUM_CLASSES, STD, sample_data

from fastdata import ops
from fastdata._ops_policy import RAND_AUGMENT_OPS, policy_steps, rand_augment_values
from fastdata.datasets import ShardDataset
from fastdata.gpu import Normalize
from fastdata.transforms import (
    CutMix,
    MixUp,
    RandAugment,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    _kernels,
)
from fastdata.transforms._steps import run_steps


def _timed_kernels() -> tuple[Counter[str], Counter[str]]:
    """Wrap the CPU kernels to add their thread CPU time and image count per name (until
    :func:`_untimed_kernels`)."""
    seconds: Counter[str] = Counter()
    images: Counter[str] = Counter()
    for name, kernel in list(_kernels.CPU_KERNELS.items()):

        def timed(batch: np.ndarray, *rest: Any, _name: str = name, _kernel: Any = kernel) -> Any:
            start = time.thread_time()
            result = _kernel(batch, *rest)
            seconds[_name] += time.thread_time() - start
            images[_name] += len(batch)
            return result

        _kernels.CPU_KERNELS[name] = timed
    return seconds, images


UNTIMED_KERNELS = dict(_kernels.CPU_KERNELS)


def _untimed_kernels() -> None:
    _kernels.CPU_KERNELS.update(UNTIMED_KERNELS)


def op_costs(
    batches: list[np.ndarray], policy: ops.RandAugment, repeats: int
) -> dict[str, dict[str, float]]:
    """Each of RandAugment's ops on every image of each ``(B, H, W, 3)`` uint8 batch at
    ``policy``'s magnitude (signs alternating): best CPU ms per batch over ``repeats``
    passes, and ms per image of a policy batch (the op's share: ``num_ops * p / 15``)."""
    count, height, width = batches[0].shape[:3]
    heights, widths = np.full(count, height), np.full(count, width)
    level = np.full(count, policy.magnitude)
    negate = np.arange(count) % 2 == 1
    options = {"interpolation": policy.interpolation, "fill": policy.fill}
    share = policy.num_ops * policy.p / len(RAND_AUGMENT_OPS)
    costs = {}
    for op_index, name in enumerate(RAND_AUGMENT_OPS):
        values = rand_augment_values(name, level, negate, policy.increasing)
        if name == "translate_x":
            values = values * widths
        elif name == "translate_y":
            values = values * heights
        chosen = np.full(count, op_index)
        steps = policy_steps(RAND_AUGMENT_OPS, values, chosen, heights, widths, options)
        best = float("inf")
        for _ in range(repeats):
            seconds = 0.0
            for batch in batches:
                images = batch.copy()
                start = time.process_time()
                run_steps(steps, images, [], None, 1)
                seconds += time.process_time() - start
            best = min(best, seconds / len(batches))
        costs[name] = {
            "ms_per_batch": 1e3 * best,
            "ms_per_policy_image": 1e3 * best / count * share,
        }
    return dict(sorted(costs.items(), key=lambda item: -item[1]["ms_per_policy_image"]))


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/fdbench"), help="cache folder")
    parser.add_argument("--num-images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8, help="batches per pass")
    parser.add_argument("--repeats", type=int, default=3, help="passes (best kept)")
    parser.add_argument(
        "--op-repeats", type=int, default=5, help="passes of each RandAugment op (best kept)"
    )
    add_publish_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    shards = sample_data(args.data, args.num_images)[3]
    rows = ShardDataset(shards)
    rng = np.random.default_rng(0)
    batch = args.batch_size
    sources = [
        rows.__getitems__(rng.choice(len(rows), batch, replace=False).tolist())[0]
        .permute(0, 2, 3, 1)
        .numpy()
        .copy()
        for _ in range(args.batches)
    ]
    targets = torch.arange(batch) % NUM_CLASSES
    crop, flip = RandomResizedCrop(224, seed=1), RandomHorizontalFlip(seed=2)
    policy, erase = RandAugment(2, 9, 0.5, seed=3), RandomErasing(p=0.25, seed=4)
    mixup, cutmix = MixUp(0.8, NUM_CLASSES, seed=5), CutMix(1.0, NUM_CLASSES, seed=6)
    normalize = Normalize([255 * m for m in MEAN], [255 * s for s in STD])
    cropped = np.empty((batch, 224, 224, 3), np.uint8)
    collated = torch.from_numpy(cropped).permute(0, 3, 1, 2)  # the dataset's collated view
    stages: dict[str, Callable[[np.ndarray], Any]] = {
        "RandomResizedCrop 224": lambda s: crop.apply_all(s, [], None, 1, cropped),
        "RandomHorizontalFlip": lambda s: flip.apply(cropped, None, 1),
        "RandAugment n2 m9 mstd0.5": lambda s: policy.apply(cropped, None, 1),
        "RandomErasing 0.25": lambda s: erase.apply(cropped, None, 1),
        "MixUp (collated batch)": lambda s: mixup(collated, targets),
        "CutMix (collated batch)": lambda s: cutmix(collated, targets),
        "gpu.Normalize on the CPU": lambda s: normalize(collated),
        "MixUp + Normalize, one pass": lambda s: mixup(collated, targets, normalize=normalize),
        "CutMix + Normalize, one pass": lambda s: cutmix(collated, targets, normalize=normalize),
    }
    seconds_per_image: dict[str, float] = {}
    faults_per_image: dict[str, float] = {}
    for _ in range(args.repeats):
        totals: Counter[str] = Counter()
        faults: Counter[str] = Counter()
        for source in sources:
            for name, stage in stages.items():
                start, first = time.thread_time(), _faults()
                stage(source)
                totals[name] += time.thread_time() - start
                faults[name] += _faults() - first
        count = len(sources) * batch
        for name in stages:
            best = seconds_per_image.get(name, float("inf"))
            if totals[name] / count < best:
                seconds_per_image[name] = totals[name] / count
                faults_per_image[name] = faults[name] / count
    print("\n| op | CPU ms per image | page faults per image |\n|---|---:|---:|")
    for name, value in seconds_per_image.items():
        print(f"| {name} | {1e3 * value:.3f} | {faults_per_image[name]:.1f} |")
    kernel_seconds, kernel_images = _timed_kernels()  # a pass of the policy alone, timed inside
    for source in sources:
        crop.apply_all(source, [], None, 1, cropped)
        policy.apply(cropped, None, 1)
    drawn = len(sources) * batch
    kernels = {
        name: {
            "ms_per_image_run": 1e3 * kernel_seconds[name] / kernel_images[name],
            "ms_per_batch_image": 1e3 * kernel_seconds[name] / drawn,
        }
        for name in sorted(kernel_seconds, key=kernel_seconds.__getitem__, reverse=True)
    }
    print("\n| RandAugment kernel | ms per image it ran on | ms per image of the batch |")
    print("|---|---:|---:|")
    for name, figures in kernels.items():
        print(
            f"| {name} | {figures['ms_per_image_run']:.3f} | {figures['ms_per_batch_image']:.3f} |"
        )
    _untimed_kernels()
    cropped_batches = []
    for source in sources:
        crop.apply_all(source, [], None, 1, cropped)
        cropped_batches.append(cropped.copy())
    per_op = op_costs(cropped_batches, policy.op, args.op_repeats)
    print(f"\n| RandAugment op, all {batch} images | CPU ms per batch | ms per policy image |")
    print("|---|---:|---:|")
    for name, figures in per_op.items():
        print(f"| {name} | {figures['ms_per_batch']:.2f} | {figures['ms_per_policy_image']:.4f} |")
    save(
        "augment_ops",
        {
            "batch_size": batch,
            "batches": args.batches,
            "repeats_best_of": args.repeats,
            "cpu_ms_per_image": {k: 1e3 * v for k, v in seconds_per_image.items()},
            "page_faults_per_image": faults_per_image,
            "rand_augment_kernels": kernels,
            "rand_augment_ops_on_every_image": per_op,
        },
        publish=args.publish,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

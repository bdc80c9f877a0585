"""Decode throughput (images/s) of each decoder backend on JPEG shards of the sample dataset,
bare and through a DataLoader.

Builds (once, under ``--workdir``, default ``$TMPDIR/fastdata-bench``) the sample
ImageFolder with ``tools/make_sample_dataset.py`` and two JPEG-mode shard sets from it: the
original files, and the images re-encoded at max side 256. Then, for every backend available
here and for a plain per-sample PIL pipeline (the usual torchvision recipe, in a DataLoader
with one worker per CPU), it decodes one pass over each set to the same output (random
resized crop or centre crop to ``--size``) and reports images/s and the ratio to the PIL
pipeline. Results go to a JSON file with machine and version metadata.

Then, through a DataLoader with one worker per CPU on the max-side-256 set (random resized
crop to ``--size``), back to back in one run: ``ShardDataset`` decoding in the workers,
``DecodingLoader`` with the ``cpu`` decoder (which decodes in the workers), the same with
``decode_in_workers=False`` (decoding in the main process), and FFCV's JPEG mode on the
same images when ``ffcv`` is installed (skipped with a note otherwise); ratios are to the
``ShardDataset`` worker path.

    python benchmarks/bench_decode.py                      # 2000 images, batch 256, 224x224
    python benchmarks/bench_decode.py --num-images 200 --quick
    python benchmarks/bench_decode.py --only-loaders       # only the DataLoader comparison

A whole run writes ``results/decode.json``; ``--only-loaders`` writes
``results/decode_loaders.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fastdata._system import usable_cpus
from fastdata.datasets import ShardDataset, passthrough_collate
from fastdata.decode import DecodingLoader, create_decoder
from fastdata.decode._geometry import center_box, random_box
from fastdata.decode.nvjpeg import torchvision_too_old, torchvision_version
from fastdata.ops import RandomResizedCrop
from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, save_manifest
from fastdata.transforms import RandomResizedCrop as BatchRandomResizedCrop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import add_publish_argument, images_per_second, load_tool, save

FIELDS = [
    FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
    FieldSpec("label", "array", "int64"),
]


def _write_shards(root: Path, blobs: Sequence[bytes], labels: Sequence[int]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with ShardWriter(root / "shard-00000.h5", FIELDS) as writer:
        for blob, label in zip(blobs, labels, strict=True):
            writer.append({"image": blob, "label": label})
        info = writer.close()
    save_manifest(root, Manifest(fields=FIELDS, shards=[info]))


def _max_side(blob: bytes, side: int) -> bytes:
    image = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError("the sample dataset holds an undecodable JPEG")
    scale = side / max(image.shape[:2])
    if scale < 1:
        size = (round(image.shape[1] * scale), round(image.shape[0] * scale))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return encoded.tobytes()


def build_datasets(workdir: Path, num_images: int) -> dict[str, Path]:
    """The two JPEG shard sets (``original``, ``max256``), built once per image count."""
    sets = {"original": workdir / f"shards-{num_images}-original",
            "max256": workdir / f"shards-{num_images}-max256"}  # fmt: skip
    if all((path / "index.json").exists() for path in sets.values()):
        return sets
    folder = workdir / f"images-{num_images}"
    paths = load_tool("make_sample_dataset").make_sample_dataset(
        folder, num_images, num_classes=10, seed=0
    )
    blobs = [path.read_bytes() for path in paths]
    labels = [i % 10 for i in range(num_images)]
    _write_shards(sets["original"], blobs, labels)
    _write_shards(sets["max256"], [_max_side(b, 256) for b in blobs], labels)
    return sets


class PilSamples(Dataset[torch.Tensor]):
    """The plain per-sample pipeline: PIL decode, crop, bilinear resize, one image at a time
    in DataLoader workers (what a torchvision ImageFolder recipe does)."""

    def __init__(self, root: Path, size: int, train: bool) -> None:
        self.reader = ShardReader(root)
        self.size, self.train = size, train
        self.crop = RandomResizedCrop(size)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> torch.Tensor:
        blob = self.reader.read("image", index)
        image = Image.open(io.BytesIO(blob.tobytes())).convert("RGB")
        hw = (image.height, image.width)
        if self.train:
            draws = np.random.default_rng(index).random(self.crop.draws_per_sample)
            box = random_box(hw, self.crop, draws)
        else:
            box = center_box(hw, (self.size, self.size))
        region = (box.left, box.top, box.left + box.width, box.top + box.height)
        resized = image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=region)
        return torch.from_numpy(np.array(resized)).permute(2, 0, 1)


def time_pil(root: Path, size: int, train: bool, batch: int) -> float:
    """Images/s of one pass of the per-sample PIL pipeline with one worker per CPU."""
    dataset = PilSamples(root, size, train)
    loader = DataLoader(dataset, batch_size=batch, num_workers=usable_cpus())
    start = time.perf_counter()
    for _ in loader:
        pass
    return len(dataset) / (time.perf_counter() - start)


def time_pass(reader: ShardReader, decode: Callable[[Any], Any], batch: int) -> float:
    """Images/s of one pass: read each batch of encoded bytes from the shards, decode it."""
    count = len(reader)
    decode(reader.read_batch("image", list(range(min(batch, count)))))  # warm-up
    start = time.perf_counter()
    for first in range(0, count, batch):
        decode(reader.read_batch("image", list(range(first, min(first + batch, count)))))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return count / (time.perf_counter() - start)


def available_backends() -> list[str]:
    backends = ["cpu"]
    if importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.dali"):
        backends.append("dali")
    version = torchvision_version()
    if torch.cuda.is_available() and version is not None and not torchvision_too_old(version):
        backends.append("nvjpeg")
    return backends


def _ffcv_beton(root: Path, out: Path) -> Path:
    """The shard set's images written as an FFCV dataset in JPEG mode (quality 90)."""
    fields_module = importlib.import_module("ffcv.fields")
    writer_module = importlib.import_module("ffcv.writer")
    if out.exists():
        return out
    reader = ShardReader(root)

    class Images:
        def __len__(self) -> int:
            return len(reader)

        def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
            blob = np.asarray(reader.read("image", index))
            bgr = cv2.imdecode(blob, cv2.IMREAD_COLOR)
            return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), int(reader.read("label", index))

    fields = {
        "image": fields_module.RGBImageField(write_mode="jpg", jpeg_quality=90),
        "label": fields_module.IntField(),
    }
    partial = out.with_suffix(".partial")
    writer = writer_module.DatasetWriter(str(partial), fields, num_workers=1)
    writer.from_indexed_dataset(Images())
    partial.rename(out)
    return out


def _ffcv_loader(beton: Path, size: int, batch: int, workers: int) -> Any:
    decoders = importlib.import_module("ffcv.fields.decoders")
    loading = importlib.import_module("ffcv.loader")
    transforms = importlib.import_module("ffcv.transforms")
    pipelines = {
        "image": [
            decoders.RandomResizedCropRGBImageDecoder((size, size)),
            transforms.ToTensor(),
            transforms.ToTorchImage(),
        ],
        "label": [decoders.IntDecoder(), transforms.ToTensor()],
    }
    return loading.Loader(str(beton), batch_size=batch, num_workers=workers,
                          order=loading.OrderOption.RANDOM, pipelines=pipelines,
                          os_cache=True)  # fmt: skip


def loader_rows(root: Path, workdir: Path, size: int, batch: int, repeats: int) -> dict[str, Any]:
    """Images/s through a DataLoader (one worker per CPU, shuffled, random resized crop),
    each loader built once and measured in round-robin passes, best of ``repeats``."""
    workers = usable_cpus()
    common = {"batch_size": batch, "shuffle": True, "num_workers": workers,
              "persistent_workers": True, "collate_fn": passthrough_collate}  # fmt: skip
    worker_path = DataLoader(
        ShardDataset(root, transform=BatchRandomResizedCrop(size), show_progress=False), **common
    )
    encoded = ShardDataset(root, decode=False, show_progress=False)

    def decoding(in_workers: bool) -> DecodingLoader:
        decoder = create_decoder("cpu", size=size, random_crop=True, seed=0)
        return DecodingLoader(DataLoader(encoded, **common), decoder, decode_in_workers=in_workers)

    loaders: dict[str, Any] = {
        "ShardDataset, decode in workers": worker_path,
        "DecodingLoader + cpu": decoding(True),
        "DecodingLoader + cpu, decode_in_workers=False": decoding(False),
    }
    notes: list[str] = []
    if importlib.util.find_spec("ffcv") is None:
        notes.append("FFCV not installed: its JPEG mode was not measured (pip install ffcv)")
    else:
        beton = _ffcv_beton(root, workdir / f"{root.name}.beton")
        loaders["FFCV JPEG mode"] = _ffcv_loader(beton, size, batch, workers)
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, loader in loaders.items():
            rate = images_per_second(loader, warm_epochs=1, min_seconds=3.0)
            best[name] = max(best.get(name, 0.0), rate)
    reference = best["ShardDataset, decode in workers"]
    rows = [
        {
            "loader": name,
            "images_per_s": round(rate, 1),
            "x_worker_path": round(rate / reference, 2),
        }
        for name, rate in best.items()
    ]
    return {
        "set": root.name,
        "workers": workers,
        "output": [size, size],
        "rows": rows,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--size", type=int, default=224, help="output side (square)")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "fastdata-bench"
    )
    parser.add_argument("--repeats", type=int, default=3, help="passes per backend (best kept)")
    parser.add_argument("--quick", action="store_true", help="skip the slow PIL baseline")
    parser.add_argument(
        "--only-loaders", action="store_true", help="only the DataLoader comparison"
    )
    add_publish_argument(parser)
    args = parser.parse_args(argv)

    sets = build_datasets(args.workdir, args.num_images)
    loaders = loader_rows(sets["max256"], args.workdir, args.size, args.batch_size, args.repeats)
    for row in loaders["rows"]:
        print(f"{row['loader']:>46} {row['images_per_s']:>9.1f} images/s "
              f"{row['x_worker_path']:>5.2f}x the worker path")  # fmt: skip
    for note in loaders["notes"]:
        print(note)
    if args.only_loaders:
        summary = {"num_images": args.num_images, "batch_size": args.batch_size,
                   "repeats_best_of": args.repeats, "dataloader": loaders}  # fmt: skip
        save("decode_loaders", summary, publish=args.publish)
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict[str, Any]] = []
    for set_name, path in sets.items():
        reader = ShardReader(path)
        for mode in ("train", "eval"):
            train = mode == "train"
            decoders = {
                backend: create_decoder(backend, size=args.size, random_crop=train,
                                        device="cpu" if backend == "cpu" else device, seed=0)
                for backend in available_backends()
            }  # fmt: skip
            best: dict[str, float] = {}
            # round-robin repeats, best of each: the machine is shared, so runs are noisy
            for _ in range(args.repeats):
                if not args.quick:
                    rate = time_pil(path, args.size, train, args.batch_size)
                    best["pil_per_sample"] = max(best.get("pil_per_sample", 0.0), rate)
                for backend, decoder in decoders.items():
                    rate = time_pass(reader, decoder, args.batch_size)
                    best[backend] = max(best.get(backend, 0.0), rate)
            for backend, rate in best.items():
                used = decoders.get(backend)
                row: dict[str, Any] = {
                    "set": set_name,
                    "mode": mode,
                    "backend": backend,
                    "device": str(used.device) if used else "cpu",
                    "images_per_s": round(rate, 1),
                }
                if "pil_per_sample" in best:
                    row["x_pil"] = round(rate / best["pil_per_sample"], 2)
                rows.append(row)
            for decoder in decoders.values():
                decoder.close()
        reader.close()

    result = {
        "num_images": args.num_images,
        "batch_size": args.batch_size,
        "repeats_best_of": args.repeats,
        "output": [args.size, args.size],
        "rows": rows,
        "dataloader": loaders,
    }
    save("decode", result, partial=args.quick, publish=args.publish)
    for row in rows:
        ratio = f"{row['x_pil']:>6.2f}x PIL" if "x_pil" in row else ""
        label = f"{row['set']:>9} {row['mode']:>5} {row['backend']:>15}"
        print(f"{label} {row['images_per_s']:>9.1f} images/s {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

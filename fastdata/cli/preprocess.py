"""``fastdata preprocess SRC OUT``: decode, transform and store a dataset as uint8 shards."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from fastdata._system import format_bytes
from fastdata.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from fastdata.preprocess import (
    ON_ERROR,
    RESIZE_MODES,
    SOURCE_KINDS,
    STORAGE_MODES,
    PreprocessOptions,
    RayEngine,
    load_python_source,
    preprocess,
)
from fastdata.preprocess._options import DEFAULT_SHARD_BYTES
from fastdata.shards import COMPRESSIONS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "preprocess",
        help="decode, resize and store images (or .npy arrays) as uint8 HDF5 shards",
        description="Decode, transform and store a dataset as uint8 HDF5 shards plus "
        "index.json. Rerunning the same command resumes an interrupted run.",
    )
    parser.add_argument(
        "src",
        help="ImageFolder, CSV/TSV list of path,label, image folder "
        "(with --masks) or folder of .npy arrays; with --from-python, module:attribute",
    )
    parser.add_argument("out", help="output folder")
    parser.add_argument(
        "--from-python",
        action="store_true",
        help="SRC is module:attribute (or file.py:attribute): a map-style dataset object, or "
        "a zero-argument callable returning one, imported with the current folder on sys.path",
    )
    parser.add_argument("--kind", choices=SOURCE_KINDS, default="auto", help="source kind")
    parser.add_argument("--masks", help="mask folder of a segmentation source (matched by stem)")
    parser.add_argument(
        "--size",
        type=int,
        nargs="+",
        default=[224],
        help="output side(s); several give image, image_<S>... in one pass",
    )
    parser.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        default="shorter",
        help="shorter: resize+centre crop; exact: stretch; pad: fit+pad; "
        "longer: cap the longer side (jpeg only)",
    )
    parser.add_argument("--storage", choices=STORAGE_MODES, default="raw")
    parser.add_argument("--grayscale", action="store_true", help="store one channel")
    parser.add_argument("--compression", choices=COMPRESSIONS, help="lossless, raw only")
    parser.add_argument("--jpeg-quality", type=int, default=90, help="jpeg storage quality")
    parser.add_argument(
        "--shard-mb",
        type=float,
        default=DEFAULT_SHARD_BYTES / 2**20,
        help="target shard size in MiB (default 1024)",
    )
    parser.add_argument(
        "--on-error",
        choices=ON_ERROR,
        default="skip",
        help="skip (report, record) or fail on an unreadable input",
    )
    parser.add_argument(
        "--workers", type=int, help="processes (default: usable CPUs; CPUs of a local Ray)"
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool here; ray: Ray tasks (pip install 'fastdata[ray]')",
    )
    parser.add_argument(
        "--address", help="Ray cluster address for --engine ray (default: a local Ray instance)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an output folder holding another job"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    engine = None
    if args.address is not None and args.engine != "ray":
        print("fastdata preprocess: error: --address needs --engine ray", file=sys.stderr)
        return EXIT_USAGE
    if args.engine == "ray":
        try:
            engine = RayEngine(args.address, num_cpus=args.workers)
        except ModuleNotFoundError as exc:
            print(f"fastdata preprocess: error: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        # say which Ray instance runs the job: a running one, or a private one it starts
        logging.getLogger("fastdata.preprocess._ray").setLevel(logging.INFO)
    src: Any = args.src
    if args.from_python:
        if args.kind != "auto" or args.masks is not None:
            print(
                "fastdata preprocess: error: --kind and --masks describe a path source, not "
                "--from-python (a dataset's items carry their own labels and masks)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        src = load_python_source(args.src)
    options = PreprocessOptions(
        sizes=tuple(args.size),
        resize=args.resize,
        storage=args.storage,
        grayscale=args.grayscale,
        compression=args.compression,
        jpeg_quality=args.jpeg_quality,
        shard_bytes=max(1, int(args.shard_mb * 2**20)),
        on_error=args.on_error,
    )
    summary = preprocess(
        src,
        args.out,
        options,
        kind=args.kind,
        masks=args.masks,
        workers=args.workers,
        overwrite=args.overwrite,
        show_progress=not args.quiet,
        engine=engine,
    )
    reused = f" ({summary.num_reused_shards} kept from an earlier run)" * bool(
        summary.num_reused_shards
    )
    print(
        f"{summary.num_samples} samples in {summary.num_shards} shard(s){reused}, "
        f"{format_bytes(summary.num_bytes)}, in {summary.elapsed_s:.1f} s: "
        f"{summary.images_per_s:,.0f} images/s; skipped {summary.num_skipped}"
    )
    if summary.num_skipped:
        print(f"skipped inputs are listed in {summary.out}/index.json ('skipped')", file=sys.stderr)
    return EXIT_OK

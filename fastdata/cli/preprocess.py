"""``fastdata preprocess SRC OUT``: decode, transform and store a dataset as uint8 shards."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from fastdata._codec import DEFAULT_MAX_PIXELS, output_size_problem
from fastdata._storage import is_url
from fastdata._system import format_bytes
from fastdata.cli import EXIT_OK
from fastdata.cli._args import (
    QUIET_HELP,
    HelpFormatter,
    int_between,
    on_error_policy,
    positive_float,
    positive_int,
)
from fastdata.errors import OnError
from fastdata.preprocess import (
    DEFAULT_SHARD_BYTES,
    RESIZE_MODES,
    SOURCE_KINDS,
    STORAGE_MODES,
    FileListSource,
    ImageFolderSource,
    NpyFolderSource,
    PreprocessOptions,
    RayEngine,
    SegmentationSource,
    Source,
    load_python_source,
    open_annotations,
    preprocess,
)
from fastdata.shards import COMPRESSIONS, load_manifest


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "preprocess",
        help="decode, resize and store images (or .npy arrays) as uint8 HDF5 shards",
        description="Decode, transform and store a dataset as uint8 HDF5 shards plus "
        "index.json. Rerunning the same command resumes an interrupted run.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "src",
        help="ImageFolder, CSV/TSV list of path,label, image folder (with --masks or an "
        "annotation option) or folder of .npy arrays; with --from-python, module:attribute",
    )
    parser.add_argument("out", help="output folder")
    parser.add_argument(
        "--from-python",
        action="store_true",
        help="SRC is module:attribute (or file.py:attribute): a map-style dataset object, or "
        "a zero-argument callable returning one, imported with the current folder on sys.path",
    )
    parser.add_argument("--kind", choices=SOURCE_KINDS, default="auto", help="source kind")
    boxes = parser.add_mutually_exclusive_group()
    boxes.add_argument(
        "--coco", metavar="JSON", help="detection boxes from a COCO file (SRC: its image folder)"
    )
    boxes.add_argument(
        "--yolo",
        metavar="DIR",
        help="detection boxes from YOLO .txt labels, one per image of SRC (matched by path)",
    )
    boxes.add_argument(
        "--voc", metavar="DIR", help="detection boxes from Pascal VOC .xml files (SRC: images)"
    )
    boxes.add_argument(
        "--annotations",
        metavar="PATH",
        help="detection boxes, format detected: a .json file is COCO, a folder of .txt YOLO, "
        "a folder of .xml VOC",
    )
    parser.add_argument(
        "--classes",
        metavar="FILE",
        help="YOLO/VOC: class names, one a line (label i is line i; default: YOLO's "
        "classes.txt, VOC's sorted names)",
    )
    parser.add_argument("--masks", help="mask folder of a segmentation source (matched by stem)")
    parser.add_argument(
        "--mask-suffix",
        type=_mask_suffix,
        help="masks are named <image stem><suffix>.<ext>, e.g. _mask (in --masks, or beside "
        "the images without it)",
    )
    parser.add_argument(
        "--path-column",
        help="CSV/TSV list: column of the paths (header name or 0-based number)",
    )
    parser.add_argument(
        "--label-column",
        help="CSV/TSV list: column of the labels (header name or 0-based number)",
    )
    parser.add_argument(
        "--size",
        type=positive_int,
        nargs="+",
        default=[224],
        metavar="SIZE",
        help="output side(s) in pixels; several give image, image_<S>... in one pass "
        "(default: 224)",
    )
    parser.add_argument(
        "--resize",
        choices=RESIZE_MODES,
        help="shorter: resize+centre crop; exact: stretch; pad: fit+pad; longer: cap the "
        "longer side (--storage jpeg only); keep: shorter side to SIZE, whole image kept "
        "(aspect up to 3:1) for training-time crops (default: shorter; pad with --coco, "
        "--yolo, --voc or --annotations, so that no box is cut off)",
    )
    parser.add_argument(
        "--storage",
        choices=STORAGE_MODES,
        default="raw",
        help="raw: fixed-size uint8 pixel arrays, memory-mapped at training time (fastest to "
        "read, about 150 KB per 224x224 RGB image); jpeg: images re-encoded as JPEG (masks as "
        "PNG), several times smaller, decoded at training time (on the CPU or the GPU)",
    )
    parser.add_argument("--grayscale", action="store_true", help="store one channel")
    parser.add_argument(
        "--compression", choices=COMPRESSIONS, help="lossless compression, --storage raw only"
    )
    parser.add_argument(
        "--jpeg-quality",
        type=int_between(1, 100),
        default=90,
        metavar="Q",
        help="JPEG quality 1-100 of --storage jpeg",
    )
    parser.add_argument(
        "--shard-mb",
        type=positive_float,
        default=DEFAULT_SHARD_BYTES / 2**20,
        metavar="MIB",
        help=f"target shard size in MiB (default: {DEFAULT_SHARD_BYTES >> 20})",
    )
    parser.add_argument(
        "--on-error",
        type=on_error_policy,
        choices=OnError.spellings(),
        default=str(OnError.SKIP),
        help="an unreadable input: skip it or warn (also log it), either way recorded in "
        "index.json's 'skipped'; or raise: stop",
    )
    parser.add_argument(
        "--max-pixels",
        type=_max_pixels,
        default=DEFAULT_MAX_PIXELS,
        metavar="N",
        help="refuse (as --on-error says) an input whose header claims more pixels, before "
        f"decoding (default: {DEFAULT_MAX_PIXELS:,}, PIL's limit; 0: no limit)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="processes (default: usable CPUs; CPUs of a local Ray)",
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool here; ray: Ray tasks (pip install 'torch-fastdata[ray]')",
    )
    parser.add_argument(
        "--address", help="Ray cluster address for --engine ray (default: a local Ray instance)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an output folder holding another job"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    parser.set_defaults(func=run, validate=validate)


def validate(args: argparse.Namespace) -> str | None:
    """The option combinations ``preprocess`` refuses: a message naming them, or ``None``."""
    if args.address is not None and args.engine != "ray":
        return "--address needs --engine ray"
    size_problem = output_size_problem(tuple(args.size), args.max_pixels or None, "--max-pixels")
    if size_problem:
        return f"--size {max(args.size)}: {size_problem}"
    annotations = _annotation_option(args)
    if args.classes is not None and (annotations is None or annotations[0] == "--coco"):
        return (
            "--classes names the classes of --yolo, --voc or --annotations (a COCO file "
            "names its own)"
        )
    path_options = _path_options_given(args)
    if annotations is not None:
        given = ["--from-python"] * bool(args.from_python) + path_options
        if given:
            return (
                f"{', '.join(given)}: not with {annotations[0]} (SRC is the image folder of "
                "the annotations)"
            )
    if args.from_python:
        if path_options:
            return (
                f"{', '.join(path_options)}: --kind and --masks (and the column and mask-suffix "
                "options) describe a path source, not --from-python (a dataset's items carry "
                "their own labels and masks)"
            )
        return None
    columns = args.path_column is not None or args.label_column is not None
    is_file = is_url(args.src) or Path(args.src).is_file()  # a URL: checked when listed
    if columns and not (is_file and args.kind in ("auto", "list")):
        return f"--path-column/--label-column are for a CSV/TSV list source, got {args.src!r}"
    if args.mask_suffix is not None and args.kind not in ("auto", "segmentation"):
        return f"--mask-suffix is for image + mask pairs, got --kind {args.kind}"
    if len(set(args.size)) != len(args.size):
        return f"--size values must be distinct, got {' '.join(map(str, args.size))}"
    if args.resize == "longer" and args.storage != "jpeg":
        return (
            "--resize longer keeps each image's aspect ratio, so sizes vary: it needs "
            "--storage jpeg (or use --resize shorter, exact or pad)"
        )
    if args.compression is not None and args.storage != "raw":
        return f"--compression applies to --storage raw only, got --storage {args.storage}"
    if args.kind == "segmentation" and args.masks is None:
        return "--kind segmentation needs --masks MASKS (the folder of masks)"
    if args.masks is not None:
        if args.kind not in ("auto", "segmentation"):
            return f"--masks is for image folders with a mask folder, not --kind {args.kind}"
        if args.src is not None and Path(args.src).is_file():
            return (
                f"--masks needs SRC to be a folder of images, got the file {args.src} "
                "(a CSV/TSV list has no masks)"
            )
    if args.shard_mb * 2**20 < 1:
        return f"--shard-mb must be at least one byte (1e-6 MiB), got {args.shard_mb}"
    return None


def _resize_mode(args: argparse.Namespace) -> str:
    """``--resize``, else ``pad`` for detection annotations (a centre crop would cut boxes
    off), else ``shorter``."""
    if args.resize is not None:
        return str(args.resize)
    return "pad" if _annotation_option(args) is not None else "shorter"


def _path_options_given(args: argparse.Namespace) -> list[str]:
    """The options given that describe a path source's files (kind, masks, columns)."""
    given = {
        "--kind": args.kind != "auto",
        "--masks": args.masks is not None,
        "--mask-suffix": args.mask_suffix is not None,
        "--path-column": args.path_column is not None,
        "--label-column": args.label_column is not None,
    }
    return [name for name, is_given in given.items() if is_given]


def _annotation_option(args: argparse.Namespace) -> tuple[str, str, str] | None:
    """``(option, format, path)`` of the annotation option given, or ``None``."""
    for option, name in (("--coco", "coco"), ("--yolo", "yolo"), ("--voc", "voc"),
                         ("--annotations", "auto")):  # fmt: skip
        value = getattr(args, option[2:])
        if value is not None:
            return option, name, value
    return None


def _mask_suffix(value: str) -> str:
    if not value or "/" in value:
        raise argparse.ArgumentTypeError(
            f"must be a non-empty part of a file name such as _mask, got {value!r}"
        )
    return value


def _max_pixels(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(
            f"must be a pixel count (0: no limit), e.g. 89478485, got {value!r}"
        )
    return number


def _source(args: argparse.Namespace) -> str | Source:
    """SRC as ``preprocess`` takes it: the path itself when the kind is read from it, else
    the record of its kind with that kind's options."""
    if args.masks is not None or args.mask_suffix is not None or args.kind == "segmentation":
        return SegmentationSource(args.src, masks=args.masks, mask_suffix=args.mask_suffix)
    if args.path_column is not None or args.label_column is not None or args.kind == "list":
        return FileListSource(args.src, args.path_column, args.label_column)
    if args.kind == "imagefolder":
        return ImageFolderSource(args.src)
    if args.kind == "npy":
        return NpyFolderSource(args.src)
    return str(args.src)


def run(args: argparse.Namespace) -> int:
    engine = None
    if args.engine == "ray":
        engine = RayEngine(args.address, num_cpus=args.workers)
        # say which Ray instance runs the job: a running one, or a private one it starts
        logging.getLogger("fastdata.preprocess._ray").setLevel(logging.INFO)
    annotations = _annotation_option(args)
    src: Any
    if args.from_python:
        src = load_python_source(args.src)
    elif annotations is not None:
        src = open_annotations(
            args.src, annotations[2], format=annotations[1], class_names=args.classes
        )
    else:
        src = _source(args)
    options = PreprocessOptions(
        sizes=tuple(args.size),
        resize=_resize_mode(args),
        storage=args.storage,
        grayscale=args.grayscale,
        compression=args.compression,
        jpeg_quality=args.jpeg_quality,
        shard_bytes=int(args.shard_mb * 2**20),
        on_error=args.on_error,
        max_pixels=args.max_pixels,
    )
    summary = preprocess(
        src,
        args.out,
        options,
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
    _print_class_names(summary.out, shown=annotations is not None)
    if summary.num_skipped:
        print(f"skipped inputs are listed in {summary.out}/index.json ('skipped')", file=sys.stderr)
    return EXIT_OK


def _print_class_names(out: Path, shown: bool = False) -> None:
    """Show how class names of a list source (or of annotations, when ``shown``) became
    labels (recorded in index.json)."""
    manifest = load_manifest(out)
    if not (shown or manifest.source.get("kind") == "list") or not manifest.class_names:
        return
    pairs = [f"{i}={name}" for i, name in enumerate(manifest.class_names)]
    more = f", ... ({len(pairs)} classes)" if len(pairs) > 20 else ""
    print(
        f"labels ({'class names' if shown else 'class names, sorted'}; 'class_names' in "
        f"index.json): {', '.join(pairs[:20])}{more}"
    )

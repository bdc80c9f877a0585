"""Sources: what ``fastdata preprocess`` reads, listed up front as picklable items.

Four kinds, each documented in the README:

- ``imagefolder``: ``SRC/<class>/<file>``; classes sorted by name → labels ``0..K-1``.
- ``list``: a CSV/TSV file of ``path,label`` rows (an optional ``path,label`` header);
  relative paths are resolved against the list's folder; integer labels are kept, other
  labels are mapped to ``0..K-1`` in sorted order and kept as class names.
- ``segmentation``: images in ``SRC`` and masks in a second folder, matched by file stem.
- ``npy``: a folder of ``.npy`` arrays (e.g. 3-D volumes) that all share shape and dtype.

Listing validates the source as a whole (missing path, empty source, a mask without an
image, mismatched ``.npy`` shapes) so that a bad job fails before anything is written;
per-file problems (corrupt, truncated, not an image) surface later, per sample.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastdata.errors import PreprocessError

SOURCE_KINDS = ("auto", "imagefolder", "list", "segmentation", "npy")
_LIST_SUFFIXES = (".csv", ".tsv", ".txt")


@dataclass(frozen=True)
class SourceItem:
    """One input sample.

    Attributes:
        path: Absolute path of the image (or ``.npy`` array).
        name: Path relative to the source root, stored with the sample for tracing.
        label: Integer label, ``-1`` when the source has none.
        mask: Absolute path of the mask (segmentation sources only).
    """

    path: str
    name: str
    label: int = -1
    mask: str | None = None


@dataclass
class SourceListing:
    """Everything a job reads, in sample order.

    Attributes:
        kind: The resolved source kind (never ``"auto"``).
        root: The source path as given (folder or list file), absolute.
        items: The samples, in the order they are stored.
        class_names: Label ``i`` is ``class_names[i]`` (empty without labels or names).
        array_shape: Shape shared by every ``.npy`` array (``npy`` sources only).
        array_dtype: Dtype name shared by every ``.npy`` array (``npy`` sources only).
    """

    kind: str
    root: str
    items: list[SourceItem]
    class_names: list[str] = field(default_factory=list)
    array_shape: tuple[int, ...] = ()
    array_dtype: str = ""

    @property
    def has_labels(self) -> bool:
        return self.kind in ("imagefolder", "list")

    def fingerprint(self) -> str:
        """SHA-256 over the listed names, labels and masks: identifies the input set."""
        digest = hashlib.sha256(self.kind.encode())
        for item in self.items:
            digest.update(f"{item.name}\0{item.label}\0{item.mask or ''}\n".encode())
        return digest.hexdigest()

    def describe(self) -> dict[str, object]:
        """What the manifest records about the source."""
        return {"kind": self.kind, "path": self.root, "num_inputs": len(self.items)}


def _visible_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _resolve_kind(src: Path, masks: Path | None) -> str:
    if src.is_file():
        return "list"
    if masks is not None:
        return "segmentation"
    if any(p.suffix == ".npy" for p in _visible_files(src)):
        return "npy"
    return "imagefolder"


def list_source(
    src: str | Path, *, kind: str = "auto", masks: str | Path | None = None
) -> SourceListing:
    """List the samples of a source, validating it as a whole.

    Args:
        src: Folder (``imagefolder``, ``segmentation`` images, ``npy``) or list file.
        kind: One of :data:`SOURCE_KINDS`; ``"auto"`` picks ``list`` for a file,
            ``segmentation`` when ``masks`` is given, ``npy`` for a folder holding
            ``.npy`` files, ``imagefolder`` otherwise.
        masks: The mask folder of a segmentation source.

    Raises:
        ValueError: ``kind`` is unknown, or ``masks`` is given for another kind.
        PreprocessError: The source is missing, empty or inconsistent.
    """
    if kind not in SOURCE_KINDS:
        raise ValueError(f"kind must be one of {SOURCE_KINDS}, got {kind!r}")
    root = Path(src).absolute()
    if not root.exists():
        raise PreprocessError(f"source does not exist: {root}")
    mask_root = Path(masks).absolute() if masks is not None else None
    if kind == "auto":
        kind = _resolve_kind(root, mask_root)
    if mask_root is not None and kind != "segmentation":
        raise ValueError(f"masks is only for kind='segmentation', got kind={kind!r}")
    if kind == "list":
        if not root.is_file():
            raise PreprocessError(f"a list source must be a CSV/TSV file, got a folder: {root}")
        listing = _list_file(root)
    else:
        if not root.is_dir():
            raise PreprocessError(f"a {kind} source must be a folder: {root}")
        if kind == "imagefolder":
            listing = _image_folder(root)
        elif kind == "segmentation":
            if mask_root is None:
                raise ValueError("kind='segmentation' needs masks (the mask folder)")
            listing = _segmentation(root, mask_root)
        else:
            listing = _npy_folder(root)
    if not listing.items:
        raise PreprocessError(f"source has no inputs ({kind}): {root}")
    return listing


def _image_folder(root: Path) -> SourceListing:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    items = [
        SourceItem(str(path), f"{name}/{path.name}", label)
        for label, name in enumerate(classes)
        for path in _visible_files(root / name)
    ]
    return SourceListing("imagefolder", str(root), items, classes)


def _list_file(path: Path) -> SourceListing:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        with open(path, newline="") as fh:
            rows = [row for row in csv.reader(fh, delimiter=delimiter) if row]
    except (OSError, UnicodeDecodeError) as exc:
        raise PreprocessError(f"cannot read list file {path}: {exc}") from exc
    if rows and [c.strip().lower() for c in rows[0]] == ["path", "label"]:
        rows = rows[1:]
    for number, row in enumerate(rows, start=1):
        if len(row) != 2 or not row[0].strip():
            raise PreprocessError(
                f"{path}: row {number} must be 'path{delimiter}label', got {delimiter.join(row)!r}"
            )
    raw_labels = [row[1].strip() for row in rows]
    try:
        labels = [int(label) for label in raw_labels]
        class_names: list[str] = []
    except ValueError:
        class_names = sorted(set(raw_labels))
        lookup = {name: i for i, name in enumerate(class_names)}
        labels = [lookup[label] for label in raw_labels]
    base = path.parent
    items = [
        SourceItem(str((base / row[0].strip()).absolute()), row[0].strip(), label)
        for row, label in zip(rows, labels, strict=True)
    ]
    return SourceListing("list", str(path), items, class_names)


def _segmentation(images: Path, masks: Path) -> SourceListing:
    if not masks.is_dir():
        raise PreprocessError(f"mask folder does not exist: {masks}")
    image_files = {p.stem: p for p in _visible_files(images)}
    mask_files = {p.stem: p for p in _visible_files(masks)}
    orphans = sorted(set(mask_files) - set(image_files))
    if orphans:
        raise PreprocessError(
            f"{len(orphans)} mask(s) without an image, e.g. {mask_files[orphans[0]]} "
            f"(no file with stem {orphans[0]!r} in {images})"
        )
    unmasked = sorted(set(image_files) - set(mask_files))
    if unmasked:
        raise PreprocessError(
            f"{len(unmasked)} image(s) without a mask, e.g. {image_files[unmasked[0]]} "
            f"(no file with stem {unmasked[0]!r} in {masks})"
        )
    items = [
        SourceItem(str(image_files[stem]), image_files[stem].name, mask=str(mask_files[stem]))
        for stem in sorted(image_files)
    ]
    return SourceListing("segmentation", str(images), items)


def _npy_folder(root: Path) -> SourceListing:
    files = [p for p in _visible_files(root) if p.suffix == ".npy"]
    shape: tuple[int, ...] = ()
    dtype = ""
    first: Path | None = None
    for path in files:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise PreprocessError(f"cannot read .npy header of {path}: {exc}") from exc
        if first is None:
            first, shape, dtype = path, tuple(array.shape), array.dtype.name
        elif tuple(array.shape) != shape or array.dtype.name != dtype:
            raise PreprocessError(
                f"mismatched .npy arrays: {path} is {tuple(array.shape)} {array.dtype.name}, "
                f"but {first} is {shape} {dtype} (all arrays must share shape and dtype)"
            )
        del array
    items = [SourceItem(str(p), p.name) for p in files]
    return SourceListing("npy", str(root), items, array_shape=shape, array_dtype=dtype)

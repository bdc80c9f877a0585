"""Sources: what ``fastdata preprocess`` reads, listed up front as picklable items.

Four kinds, each documented in the preprocessing guide:

- ``imagefolder``: ``SRC/<class>/**/<file>``; classes sorted by name → labels ``0..K-1``;
  files in sub-folders of a class folder belong to that class (torchvision's
  ``ImageFolder`` order: folders sorted by path, files sorted within each folder).
- ``list``: a CSV/TSV file of paths and labels. A UTF-8 byte-order mark is ignored; a
  first row naming its columns (``path``, ``file``, ``image``...; ``label``, ``class``...)
  is a header, and ``path_column``/``label_column`` pick columns by header name (or
  0-based number), other columns are ignored. Relative paths are resolved against the
  list's folder. Labels are integers when every label is one; when none is, they are
  class names mapped to ``0..K-1`` in sorted order (kept as ``class_names``); a mix, an
  empty label or one outside ``0..2**63 - 1`` is an error naming the row. A file listed in
  two rows with two labels is an error naming both rows; listed twice with the same label,
  it is stored twice (a warning counts such rows).
- ``segmentation``: images in ``SRC`` and masks in a second folder (or beside the images
  with ``mask_suffix``), matched by file stem (plus ``mask_suffix``); extensions may differ.
- ``npy``: a folder of ``.npy`` arrays (e.g. 3-D volumes) that all share shape and dtype.

Listing validates the source as a whole (missing path, empty source, mismatched ``.npy``
shapes, an unreadable folder) so that a bad job fails before anything is written; per-file
problems (corrupt, truncated, not an image) surface later, per sample. An image without a
mask (or a mask without an image) follows ``on_error``: recorded in ``skipped`` or an error.
The output folder (and its ``.fastdata-job``) is never listed, wherever it lies.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastdata._labels import check_label
from fastdata.errors import OnError, PreprocessError

logger = logging.getLogger(__name__)

SOURCE_KINDS = ("auto", "imagefolder", "list", "segmentation", "npy")
_LIST_SUFFIXES = (".csv", ".tsv", ".txt")
# Header names recognised without --path-column/--label-column (compared lower-cased).
PATH_COLUMN_NAMES = ("path", "file", "filename", "file_name", "filepath", "file_path", "image",
                     "image_path", "img", "img_path", "image_file", "fname", "name")  # fmt: skip
LABEL_COLUMN_NAMES = ("label", "labels", "class", "class_name", "class_id", "category",
                      "category_id", "target", "label_id", "y")  # fmt: skip
_INT_LABEL = re.compile(r"[+-]?[0-9]+")
_JOB_DIR = ".fastdata-job"
_MANIFEST = "index.json"


def display_name(name: str) -> str:
    """``name`` as valid UTF-8 text: bytes of a non-UTF-8 file name (kept by Python as
    surrogate escapes) are written ``\\xNN``, so the name can be stored and printed."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class SourceItem:
    """One input sample.

    Attributes:
        path: Absolute path of the image (or ``.npy`` array).
        name: Path relative to the source root (valid UTF-8), stored with the sample.
        label: Integer label, ``-1`` when the source has none.
        mask: Absolute path of the mask (segmentation sources only).
        version: For an object in a store (``path`` is its URL): its size and version
            stamp as listed (what a rerun compares to find a replaced input); ``""`` for
            local files, whose size and modification time are read instead.
    """

    path: str
    name: str
    label: int = -1
    mask: str | None = None
    version: str = ""


@dataclass
class SourceListing:
    """Everything a job reads, in sample order.

    Attributes:
        kind: The resolved source kind (never ``"auto"``).
        root: The source path as given (folder or list file), absolute.
        items: The samples, in the order they are stored (a list for files; made on
            demand for a dataset object).
        class_names: Label ``i`` is ``class_names[i]`` (empty without labels or names).
        array_shape: Shape shared by every ``.npy`` array (``npy`` sources only).
        array_dtype: Dtype name shared by every ``.npy`` array (``npy`` sources only).
        skipped: Inputs left out while listing (``{"path", "reason"}``, e.g. an image
            without a mask under ``on_error="skip"``); they join the manifest's ``skipped``.
    """

    kind: str
    root: str
    items: Sequence[SourceItem]
    class_names: list[str] = field(default_factory=list)
    array_shape: tuple[int, ...] = ()
    array_dtype: str = ""
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def has_labels(self) -> bool:
        return self.kind in ("imagefolder", "list")

    def fingerprint(self) -> str:
        """SHA-256 over the listed names, labels and masks: identifies the input set."""
        digest = hashlib.sha256(self.kind.encode())
        for item in self.items:
            line = f"{item.name}\0{item.label}\0{item.mask or ''}\n"
            digest.update(line.encode("utf-8", "surrogateescape"))
        return digest.hexdigest()

    def describe(self) -> dict[str, object]:
        """What the manifest records about the source."""
        return {"kind": self.kind, "path": self.root, "num_inputs": len(self.items)}


class _Walker:
    """Lists files under folders, skipping hidden entries and the output folder."""

    def __init__(self, exclude: Iterable[str | Path]) -> None:
        self.exclude = {os.path.realpath(p) for p in exclude}

    def _excluded_dir(self, path: str) -> bool:
        return os.path.realpath(path) in self.exclude or os.path.isdir(os.path.join(path, _JOB_DIR))

    @staticmethod
    def _output_file(name: str) -> bool:
        """A file of a shard set (skipped when the output folder is the listed folder)."""
        return name == _MANIFEST or (name.startswith("shard-") and name.endswith(".h5"))

    def _scandir(self, folder: str) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(folder) as entries:
                return sorted(entries, key=lambda e: e.name)
        except OSError as exc:
            raise PreprocessError(
                f"cannot list folder {display_name(folder)}: {exc.strerror or exc}; "
                "make it readable or move it out of the source"
            ) from exc

    def files(self, folder: Path) -> list[Path]:
        """Visible files directly in ``folder``, sorted by name."""
        is_out = os.path.realpath(folder) in self.exclude
        return [
            Path(e.path)
            for e in self._scandir(str(folder))
            if not e.name.startswith(".")
            and _is_file(e)
            and not (is_out and self._output_file(e.name))
        ]

    def subfolders(self, folder: Path) -> list[Path]:
        """Visible sub-folders of ``folder`` (not the output folder), sorted by name."""
        return [
            Path(e.path)
            for e in self._scandir(str(folder))
            if not e.name.startswith(".") and _is_dir(e) and not self._excluded_dir(e.path)
        ]

    def files_recursive(self, folder: Path) -> list[Path]:
        """Visible files under ``folder`` at any depth, in torchvision ``ImageFolder``
        order (folders sorted by path, files sorted by name); symbolic links to folders
        are followed once (a link cycle is not walked twice)."""
        found: list[tuple[str, list[Path]]] = []
        seen: set[str] = set()
        pending = [folder]
        while pending:
            current = pending.pop()
            real = os.path.realpath(current)
            if real in seen:
                continue
            seen.add(real)
            found.append((str(current), self.files(current)))
            pending.extend(self.subfolders(current))
        return [path for _, paths in sorted(found, key=lambda f: f[0]) for path in paths]


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _resolve_kind(src: Path, masks: Path | None, mask_suffix: str | None, walker: _Walker) -> str:
    if src.is_file():
        return "list"
    if masks is not None or mask_suffix:
        return "segmentation"
    if any(p.suffix == ".npy" for p in walker.files(src)):
        return "npy"
    return "imagefolder"


def list_source(
    src: str | Path,
    *,
    kind: str = "auto",
    masks: str | Path | None = None,
    mask_suffix: str | None = None,
    path_column: str | None = None,
    label_column: str | None = None,
    on_error: OnError | str = OnError.RAISE,
    exclude: Iterable[str | Path] = (),
) -> SourceListing:
    """List the samples of a source, validating it as a whole.

    Args:
        src: Folder (``imagefolder``, ``segmentation`` images, ``npy``) or list file.
        kind: One of :data:`SOURCE_KINDS`; ``"auto"`` picks ``list`` for a file,
            ``segmentation`` when ``masks`` or ``mask_suffix`` is given, ``npy`` for a
            folder holding ``.npy`` files, ``imagefolder`` otherwise.
        masks: The mask folder of a segmentation source (default with ``mask_suffix``:
            the image folder itself).
        mask_suffix: The mask of ``a.jpg`` is named ``a<suffix>.<any extension>``
            (e.g. ``"_mask"``); files so named are masks, not images.
        path_column: Column of a list file holding the paths: a header name, or a
            0-based column number. Default: the header's recognised name
            (:data:`PATH_COLUMN_NAMES`), else the first column.
        label_column: Column holding the labels, as ``path_column``. Default: the
            header's recognised name (:data:`LABEL_COLUMN_NAMES`), else the second column.
        on_error: An image without a mask (or a mask without an image): ``"raise"``, or
            ``"warn"``/``"skip"`` record it in ``skipped`` (see :class:`~fastdata.errors.OnError`).
        exclude: Folders never listed (the output folder of the job).

    Raises:
        ValueError: ``kind`` is unknown, or an option is given for another kind.
        PreprocessError: The source is missing, empty, unreadable or inconsistent.
    """
    if kind not in SOURCE_KINDS:
        raise ValueError(f"kind must be one of {SOURCE_KINDS}, got {kind!r}")
    on_error = OnError.parse(on_error)
    if mask_suffix is not None and (not mask_suffix or "/" in mask_suffix):
        raise ValueError(f"mask_suffix must be a non-empty file-name part, got {mask_suffix!r}")
    root = Path(src).absolute()
    if not root.exists():
        raise PreprocessError(f"source does not exist: {root}")
    walker = _Walker(exclude)
    mask_root = Path(masks).absolute() if masks is not None else None
    if kind == "auto":
        kind = _resolve_kind(root, mask_root, mask_suffix, walker)
    if (mask_root is not None or mask_suffix) and kind != "segmentation":
        raise ValueError(f"masks/mask_suffix are only for kind='segmentation', got kind={kind!r}")
    if (path_column is not None or label_column is not None) and kind != "list":
        raise ValueError(
            f"path_column/label_column are only for a list file (kind='list'), got kind={kind!r}"
        )
    if kind == "list":
        if not root.is_file():
            raise PreprocessError(f"a list source must be a CSV/TSV file, got a folder: {root}")
        listing = _list_file(root, path_column, label_column)
    else:
        if not root.is_dir():
            raise PreprocessError(f"a {kind} source must be a folder: {root}")
        if kind == "imagefolder":
            listing = _image_folder(root, walker)
        elif kind == "segmentation":
            if mask_root is None and not mask_suffix:
                raise ValueError("kind='segmentation' needs masks (the mask folder) or mask_suffix")
            listing = _segmentation(root, mask_root or root, mask_suffix, on_error, walker)
        else:
            listing = _npy_folder(root, walker)
    if not listing.items:
        raise PreprocessError(f"source has no inputs ({kind}): {root}")
    return listing


def _image_folder(root: Path, walker: _Walker) -> SourceListing:
    classes = [p.name for p in walker.subfolders(root)]
    items = [
        SourceItem(str(path), display_name(path.relative_to(root).as_posix()), label)
        for label, name in enumerate(classes)
        for path in walker.files_recursive(root / name)
    ]
    # files beside the class folders have no class: recorded, never dropped silently
    reason = "not inside a class folder (an ImageFolder is SRC/<class>/<file>)"
    skipped = [{"path": display_name(str(p)), "reason": reason} for p in walker.files(root)]
    names = [display_name(c) for c in classes]
    return SourceListing("imagefolder", str(root), items, names, skipped=skipped)


def _sniff_delimiter(path: Path, first_line: str) -> str:
    if path.suffix.lower() == ".tsv":
        return "\t"
    if path.suffix.lower() == ".csv":
        return ","
    return "\t" if "\t" in first_line and "," not in first_line else ","


def _column_index(wanted: str, header: list[str] | None, option: str, path: Path) -> int:
    names = [c.strip().lower() for c in header] if header is not None else None
    if names is not None and wanted.strip().lower() in names:
        return names.index(wanted.strip().lower())
    if wanted.strip().isdigit():
        return int(wanted)
    found = f"its header is {header!r}" if header is not None else "it has no header row"
    raise PreprocessError(
        f"{path}: {option} {wanted!r} is not a column ({found}); give a header name or a "
        "0-based column number"
    )


def _list_file(
    path: Path,
    path_column: str | None,
    label_column: str | None,
    text: str | None = None,
    resolve: Callable[[str], str] | None = None,
) -> SourceListing:
    """The rows of list file ``path`` (``text``: its content when already read, e.g. from
    object storage, where ``resolve`` maps a listed path to its URL)."""
    if text is None:
        try:
            with open(path, newline="", encoding="utf-8-sig") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise PreprocessError(f"cannot read list file {path}: {exc}") from exc
    delimiter = _sniff_delimiter(path, text.split("\n", 1)[0])
    numbered = [
        (number, row)
        for number, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), start=1)
        if any(cell.strip() for cell in row)
    ]
    if not numbered:
        raise PreprocessError(f"source has no inputs (list): {path}")
    first = [c.strip().lower() for c in numbered[0][1]]
    # a column given by number names no header cell (a first row "0,a.jpg,3" is data)
    explicit = {
        c.strip().lower()
        for c in (path_column, label_column)
        if c is not None and not c.strip().isdigit()
    }
    # a header names a path column, or a label column while no cell looks like a file path
    # (so that a first data row whose class is called "label" or "y" is still data)
    is_header = (
        bool(explicit & set(first))
        or any(c in PATH_COLUMN_NAMES for c in first)
        or (
            any(c in LABEL_COLUMN_NAMES for c in first)
            and not any("." in c or "/" in c or "\\" in c for c in first)
        )
    )
    header = numbered[0][1] if is_header else None
    rows = numbered[1:] if is_header else numbered
    width = len(numbered[0][1])
    if path_column is not None:
        path_index = _column_index(path_column, header, "--path-column", path)
    else:
        path_index = next((i for i, c in enumerate(first) if c in PATH_COLUMN_NAMES), 0)
        path_index = path_index if is_header else 0
    if label_column is not None:
        label_index = _column_index(label_column, header, "--label-column", path)
    elif is_header and any(c in LABEL_COLUMN_NAMES for c in first):
        label_index = next(i for i, c in enumerate(first) if c in LABEL_COLUMN_NAMES)
    elif width == 2:
        label_index = 1 - path_index
    else:
        found = f"header {header!r}" if header is not None else f"{width} column(s), no header"
        raise PreprocessError(
            f"{path}: cannot tell which column holds the labels ({found}); pass "
            "--label-column (label_column=) with a header name or 0-based column number"
        )
    if path_index == label_index:
        raise PreprocessError(f"{path}: the path and label columns are both column {path_index}")
    needed = max(path_index, label_index) + 1
    paths: list[str] = []
    raw_labels: list[tuple[int, str]] = []
    for number, row in rows:
        if len(row) < needed or not row[path_index].strip():
            raise PreprocessError(
                f"{path}: row {number} must have a path in column {path_index} and a label "
                f"in column {label_index}, got {delimiter.join(row)!r}"
            )
        label = row[label_index].strip()
        if not label:
            raise PreprocessError(
                f"{path}: row {number} has an empty label ({delimiter.join(row)!r}); every "
                "row needs one"
            )
        paths.append(row[path_index].strip())
        raw_labels.append((number, label))
    labels, class_names = _parse_labels(path, raw_labels)
    base = path.parent
    _check_repeated_paths(path, paths, raw_labels, labels)
    items = [
        SourceItem(
            resolve(name) if resolve else str((base / name).absolute()), display_name(name), label
        )
        for name, label in zip(paths, labels, strict=True)
    ]
    return SourceListing("list", str(path), items, class_names)


def _check_repeated_paths(
    path: Path, names: list[str], raw: list[tuple[int, str]], labels: list[int]
) -> None:
    """A file listed twice with two labels is refused, naming both rows; listed twice with
    one label, it is kept (each row a sample, as listed: a way to oversample) and a
    warning says how many such rows there are."""
    first_row: dict[str, int] = {}
    repeats: list[tuple[int, int]] = []
    for row, name in enumerate(names):
        key = os.path.normpath(os.path.join(path.parent, name))
        earlier = first_row.setdefault(key, row)
        if earlier == row:
            continue
        if labels[earlier] != labels[row]:
            raise PreprocessError(
                f"{path}: {display_name(name)!r} is listed in row {raw[earlier][0]} with label "
                f"{raw[earlier][1]!r} and in row {raw[row][0]} with label {raw[row][1]!r}; a "
                "file has one label: remove one of the rows"
            )
        repeats.append((earlier, row))
    if repeats:
        earlier, row = repeats[0]
        logger.warning(
            "%s: %d row(s) repeat a file listed earlier with the same label (e.g. %r in rows "
            "%d and %d); each row is stored as a sample of its own",
            path,
            len(repeats),
            display_name(names[row]),
            raw[earlier][0],
            raw[row][0],
        )


def _parse_labels(path: Path, raw: list[tuple[int, str]]) -> tuple[list[int], list[str]]:
    """Integer labels when every label is one, class names when none is; else an error."""
    is_int = [bool(_INT_LABEL.fullmatch(label)) for _, label in raw]
    if all(is_int):
        labels = []
        for number, label in raw:
            labels.append(check_label(int(label), f"{path}: row {number}", PreprocessError))
        return labels, []
    if any(is_int):
        # the minority breaks the pattern: name its first row, and a row of the majority
        ints = sum(is_int)
        bad = next(i for i, ok in enumerate(is_int) if ok == (ints * 2 < len(raw)))
        good = next(i for i, ok in enumerate(is_int) if ok != is_int[bad])
        kind = "an integer" if is_int[bad] else "not an integer"
        raise PreprocessError(
            f"{path}: row {raw[bad][0]} has label {raw[bad][1]!r}, {kind}, while row "
            f"{raw[good][0]} has {raw[good][1]!r}: labels must be all integers or all class "
            "names; fix that row"
        )
    class_names = sorted({label for _, label in raw})
    lookup = {name: i for i, name in enumerate(class_names)}
    return [lookup[label] for _, label in raw], class_names


def _stems(
    files: list[Path], suffix: str, what: str, skip: bool, skipped: list[dict[str, str]]
) -> dict[str, Path]:
    """Files by stem (minus ``suffix``); a second file with the same stem is an error or,
    when ``skip``, recorded as skipped."""
    out: dict[str, Path] = {}
    for path in files:
        stem = path.stem[: len(path.stem) - len(suffix)] if suffix else path.stem
        if stem in out:
            reason = f"another {what} has the same stem ({out[stem].name}): ambiguous pair"
            if not skip:
                raise PreprocessError(f"{display_name(str(path))}: {reason}")
            skipped.append({"path": display_name(str(path)), "reason": reason})
            continue
        out[stem] = path
    return out


def _segmentation(
    images: Path, masks: Path, suffix: str | None, on_error: OnError, walker: _Walker
) -> SourceListing:
    if not masks.is_dir():
        raise PreprocessError(f"mask folder does not exist: {masks}")
    skip = on_error is not OnError.RAISE
    skipped: list[dict[str, str]] = []
    image_list = walker.files(images)
    mask_list = walker.files(masks)
    if suffix:
        mask_list = [p for p in mask_list if p.stem.endswith(suffix)]
        image_list = [p for p in image_list if not p.stem.endswith(suffix)]
    image_files = _stems(image_list, "", "image", skip, skipped)
    mask_files = _stems(mask_list, suffix or "", "mask", skip, skipped)
    hint = f"{{stem}}{suffix}.*" if suffix else "the same stem"
    orphans = sorted(set(mask_files) - set(image_files))
    unmasked = sorted(set(image_files) - set(mask_files))
    if (orphans or unmasked) and not skip:
        if orphans:
            raise PreprocessError(
                f"{len(orphans)} mask(s) without an image, e.g. "
                f"{display_name(str(mask_files[orphans[0]]))} (no file with stem "
                f"{display_name(orphans[0])!r} in {images}); --on-error skip records them "
                "and goes on"
            )
        raise PreprocessError(
            f"{len(unmasked)} image(s) without a mask, e.g. "
            f"{display_name(str(image_files[unmasked[0]]))} (no mask named {hint} in "
            f"{masks}); --on-error skip records them and goes on"
        )
    for stem in orphans:
        reason = f"mask without an image (no file with stem {display_name(stem)!r} in {images})"
        skipped.append({"path": display_name(str(mask_files[stem])), "reason": reason})
    for stem in unmasked:
        reason = f"image without a mask (no mask named {hint} in {masks})"
        skipped.append({"path": display_name(str(image_files[stem])), "reason": reason})
    for entry in skipped:
        on_error.handle(PreprocessError(f"{entry['path']}: {entry['reason']}"), log=logger)
    items = [
        SourceItem(
            str(image_files[stem]), display_name(image_files[stem].name), mask=str(mask_files[stem])
        )
        for stem in sorted(set(image_files) & set(mask_files))
    ]
    return SourceListing("segmentation", str(images), items, skipped=skipped)


def _npy_folder(root: Path, walker: _Walker) -> SourceListing:
    files = [p for p in walker.files(root) if p.suffix == ".npy"]
    shape: tuple[int, ...] = ()
    dtype = ""
    first: Path | None = None
    for path in files:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise PreprocessError(f"cannot read .npy header of {path}: {exc}") from exc
        if array.dtype.fields is not None or array.dtype.kind not in "biuf":
            raise PreprocessError(
                f"{path} has dtype {array.dtype}: only plain bool, integer or float arrays "
                "can be stored (not structured, complex, string or object arrays)"
            )
        if array.size == 0:
            raise PreprocessError(
                f"{path} is an empty array of shape {tuple(array.shape)}: remove it from the "
                "source (every array must hold data)"
            )
        native = array.dtype.newbyteorder("=").name
        if first is None:
            first, shape, dtype = path, tuple(array.shape), native
        elif tuple(array.shape) != shape or native != dtype:
            raise PreprocessError(
                f"mismatched .npy arrays: {path} is {tuple(array.shape)} {native}, "
                f"but {first} is {shape} {dtype} (all arrays must share shape and dtype)"
            )
        del array
    items = [SourceItem(str(p), display_name(p.name)) for p in files]
    return SourceListing("npy", str(root), items, array_shape=shape, array_dtype=dtype)

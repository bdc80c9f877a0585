"""Source records: what ``preprocess()`` reads, named by one value.

A path (``preprocess("photos/", ...)``) is read as the kind it looks like: a CSV/TSV file is
a list, a folder of ``.npy`` files is an array folder, any other folder an ImageFolder. A
record names the kind and carries that kind's own options, so ``preprocess`` takes one
``src`` instead of a parameter per option of every kind. A new kind of source is one more
record: a :class:`Source` subclass whose :meth:`Source.listing` lists its samples.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from fastdata._storage import is_url
from fastdata.errors import OnError
from fastdata.preprocess._remote_sources import list_remote_source
from fastdata.preprocess._sources import SourceListing, list_source

SourcePath = str | Path


def _check_path(value: object, argument: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a path (str or os.PathLike), got {value!r}")
    if not os.fspath(value):
        raise ValueError(f"{argument} must be a non-empty path, got {value!r}")


def _check_column(value: object, argument: str) -> str | None:
    """A column as ``list_source`` takes it: a header name, or a 0-based number as text."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(
            f"{argument} must be a header name (str) or a column number (int), got {value!r}"
        )
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{argument} must be a 0-based column number >= 0, got {value}")
    text = str(value)
    if not text.strip():
        raise ValueError(f"{argument} must name a column, got {value!r}")
    return text


class Source(ABC):
    """A source ``preprocess()`` reads from files: its kind and that kind's options.

    Attributes:
        kind: The source kind the manifest records (``"imagefolder"``, ``"list"``...).
        path: The folder or file it reads (absolute or relative to the working folder).
    """

    kind: ClassVar[str]
    path: SourcePath

    @abstractmethod
    def listing(self, *, on_error: OnError | str, exclude: Iterable[Path]) -> SourceListing:
        """Every sample this source holds, in the order they are stored, validated as a
        whole (``exclude``: folders never listed, the job's output folder).

        Raises:
            PreprocessError: The source is missing, empty, unreadable or inconsistent.
        """


class _ListedSource(Source):
    """A kind :func:`list_source` lists: its options are that function's keywords."""

    def list_options(self) -> dict[str, Any]:
        """The keywords of :func:`list_source` this record sets besides the kind."""
        return {}

    def listing(self, *, on_error: OnError | str, exclude: Iterable[Path]) -> SourceListing:
        return _list(self.path, self.kind, on_error, exclude, self.list_options())


@dataclass(frozen=True)
class ImageFolderSource(_ListedSource):
    """``path/<class>/**/<image>``: classes sorted by name are labels ``0..K-1``
    (torchvision's ``ImageFolder`` order).

    Args:
        path: The folder of class folders.
    """

    kind: ClassVar[str] = "imagefolder"
    path: SourcePath

    def __post_init__(self) -> None:
        _check_path(self.path, "path")


@dataclass(frozen=True)
class FileListSource(_ListedSource):
    """A CSV/TSV file of image paths (relative to the file's folder) and labels.

    Args:
        path: The list file (``.csv``, ``.tsv`` or ``.txt``).
        path_column: The column of the paths: a header name or a 0-based number. Default:
            the header's path column (``path``, ``file``, ``image``...), else the first.
        label_column: The column of the labels, as ``path_column``. Default: the header's
            label column (``label``, ``class``...), else the second of two columns.
            Integer labels are kept; class names are mapped to ``0..K-1`` in sorted order.
    """

    kind: ClassVar[str] = "list"
    path: SourcePath
    path_column: str | int | None = None
    label_column: str | int | None = None

    def __post_init__(self) -> None:
        _check_path(self.path, "path")
        _check_column(self.path_column, "path_column")
        _check_column(self.label_column, "label_column")

    def list_options(self) -> dict[str, Any]:
        return {
            "path_column": _check_column(self.path_column, "path_column"),
            "label_column": _check_column(self.label_column, "label_column"),
        }


@dataclass(frozen=True)
class SegmentationSource(_ListedSource):
    """Images and their masks, paired by file stem (extensions may differ).

    Args:
        path: The folder of images.
        masks: The folder of masks; default with ``mask_suffix``: ``path`` itself.
        mask_suffix: The mask of ``a.jpg`` is named ``a<mask_suffix>.<any extension>``
            (e.g. ``"_mask"``); files so named are masks, not images.

    Raises:
        ValueError: Neither ``masks`` nor ``mask_suffix`` is given, or ``mask_suffix`` is
            empty or holds a ``/``.
    """

    kind: ClassVar[str] = "segmentation"
    path: SourcePath
    masks: SourcePath | None = None
    mask_suffix: str | None = None

    def __post_init__(self) -> None:
        _check_path(self.path, "path")
        if self.masks is not None:
            _check_path(self.masks, "masks")
        if self.mask_suffix is not None and (
            not isinstance(self.mask_suffix, str) or not self.mask_suffix or "/" in self.mask_suffix
        ):
            raise ValueError(
                f"mask_suffix must be a non-empty file-name part such as '_mask', got "
                f"{self.mask_suffix!r}"
            )
        if self.masks is None and self.mask_suffix is None:
            raise ValueError(
                "SegmentationSource needs masks (the folder of masks) or mask_suffix (masks "
                "named <image stem><suffix> beside the images), got neither"
            )

    def list_options(self) -> dict[str, Any]:
        return {"masks": self.masks, "mask_suffix": self.mask_suffix}


@dataclass(frozen=True)
class NpyFolderSource(_ListedSource):
    """A folder of ``.npy`` arrays (e.g. 3-D volumes) that all share shape and dtype.

    Args:
        path: The folder of arrays.
    """

    kind: ClassVar[str] = "npy"
    path: SourcePath

    def __post_init__(self) -> None:
        _check_path(self.path, "path")


def list_path(
    path: SourcePath, *, on_error: OnError | str, exclude: Iterable[Path]
) -> SourceListing:
    """A path given as ``src``, listed as the kind it looks like: a file is a list, a folder
    holding ``.npy`` files an array folder, any other folder an ImageFolder."""
    return _list(path, "auto", on_error, exclude, {})


def _list(
    src: SourcePath,
    kind: str,
    on_error: OnError | str,
    exclude: Iterable[Path],
    options: dict[str, Any],
) -> SourceListing:
    """A local source listed by :func:`list_source`; one in object storage (a URL) by
    :func:`list_remote_source`, which holds ImageFolder trees and CSV/TSV lists only."""
    if not is_url(src):
        return list_source(src, kind=kind, on_error=on_error, exclude=exclude, **options)
    if options.get("masks") is not None or options.get("mask_suffix") is not None:
        raise ValueError(
            f"src {src!r}: a segmentation source must be a local folder (object storage "
            "holds ImageFolder trees and CSV/TSV lists)"
        )
    return list_remote_source(
        str(src), kind, options.get("path_column"), options.get("label_column")
    )

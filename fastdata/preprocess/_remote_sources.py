"""Sources in object storage (``s3://``, ``gs://``): an ImageFolder tree or a CSV/TSV list.

The tree is listed through the storage seam (the store pages through the listing) into
items whose paths are the objects' URLs, in the order the same tree gives on a local disk
(torchvision ``ImageFolder`` order, hidden entries left out), so a set preprocessed from
the store equals the set preprocessed from a local copy. Nothing is downloaded while
listing but a list file: each worker reads its items' bytes as it processes them
(:func:`fastdata._storage.read_input`), one object per request.
"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from pathlib import Path

from fastdata._storage import (
    ListedObject,
    RemoteLocation,
    list_tree,
    object_store,
    parse_location,
)
from fastdata.errors import PreprocessError, StorageError
from fastdata.preprocess._sources import (
    _LIST_SUFFIXES,
    SourceItem,
    SourceListing,
    _list_file,
    display_name,
)

_REMOTE_KINDS = ("auto", "imagefolder", "list")


def list_remote_source(
    url: str, kind: str, path_column: str | None, label_column: str | None
) -> SourceListing:
    """The samples of the ImageFolder tree or list file at ``url``.

    Raises:
        ValueError: ``kind`` is not one object storage holds (``imagefolder``, ``list``).
        PreprocessError: The source is missing, empty, unreadable or inconsistent.
    """
    location = parse_location(url, "src")
    if not isinstance(location, RemoteLocation):  # pragma: no cover (called for URLs only)
        raise ValueError(f"src {url!r} is not a URL")
    if kind not in _REMOTE_KINDS:
        raise ValueError(
            f"src {url!r}: kind {kind!r} must be a local folder (object storage holds "
            "imagefolder trees and list files)"
        )
    is_list = location.prefix.lower().endswith(_LIST_SUFFIXES) and not url.endswith("/")
    if kind == "auto":
        kind = "list" if is_list else "imagefolder"
    if (path_column is not None or label_column is not None) and kind != "list":
        raise ValueError(
            f"path_column/label_column are only for a list file (kind='list'), got kind={kind!r}"
        )
    try:
        if kind == "list":
            listing = _remote_list(location, path_column, label_column)
        else:
            listing = _remote_image_folder(location)
    except StorageError as exc:
        raise PreprocessError(f"cannot list source {url}: {exc}") from None
    if not listing.items:
        raise PreprocessError(f"source has no inputs ({kind}): {url}")
    return listing


def _remote_image_folder(location: RemoteLocation) -> SourceListing:
    listed = list_tree(location)
    names = [name for name in listed if not any(p.startswith(".") for p in name.split("/"))]
    root = location.url.rstrip("/")
    if not names:
        raise PreprocessError(f"source does not exist or is empty: {location.url}")
    classes = sorted({name.split("/", 1)[0] for name in names if "/" in name})
    labels = {name: label for label, name in enumerate(classes)}
    # a local walk's order: class by class, folders sorted by path, files by name in each
    in_classes = sorted(
        (name for name in names if "/" in name),
        key=lambda n: (labels[n.split("/", 1)[0]], posixpath.dirname(n), posixpath.basename(n)),
    )
    items = [
        SourceItem(
            location.child(name),
            display_name(name),
            labels[name.split("/", 1)[0]],
            version=_version(listed[name]),
        )
        for name in in_classes
    ]
    reason = "not inside a class folder (an ImageFolder is SRC/<class>/<file>)"
    skipped = [{"path": f"{root}/{n}", "reason": reason} for n in sorted(names) if "/" not in n]
    return SourceListing("imagefolder", root, items, classes, skipped=skipped)


def _remote_list(
    location: RemoteLocation, path_column: str | None, label_column: str | None
) -> SourceListing:
    url = location.url.rstrip("/")
    try:
        data = object_store(location).read_bytes(location.prefix)
    except FileNotFoundError:
        raise PreprocessError(f"source does not exist: {url}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PreprocessError(f"cannot read list file {url}: {exc}") from None
    folder = posixpath.dirname(location.prefix)
    base = RemoteLocation(location.scheme, location.bucket, folder)

    def resolve(name: str) -> str:
        relative = posixpath.normpath(name.replace("\\", "/"))
        if posixpath.isabs(relative) or relative.startswith("../") or relative == "..":
            raise PreprocessError(
                f"{url}: {name!r} lies outside the list's folder {base.url} (paths of a list "
                "in object storage are relative to its folder)"
            )
        return base.child(relative)

    listing = _list_file(Path(location.prefix), path_column, label_column, text, resolve)
    listing.root = url
    # stamp each input with its listed version (a rerun finds replaced inputs); one that is
    # not listed is read (and fails, following on_error) in its turn
    listed = {base.child(name): found for name, found in list_tree(base).items()}
    listing.items = [
        replace(item, version=_version(listed[item.path])) if item.path in listed else item
        for item in listing.items
    ]
    return listing


def _version(listed: ListedObject) -> str:
    return f"{listed.size}\0{listed.version}"

"""Source inputs of ``preprocess`` in object storage: listing a tree, reading one object.

A preprocessing worker reads each of its items through :func:`read_input`, one object per
request, so a job holds at most one input per worker in memory and never downloads the
whole tree first.
"""

from __future__ import annotations

from pathlib import Path

from fastdata._storage._backend import ListedObject, object_store
from fastdata._storage._location import RemoteLocation, is_url, parse_location


def read_input(path: str) -> bytes:
    """The bytes of an input: a local file, or an object named by its URL.

    Raises:
        FileNotFoundError: There is no such file (object).
        OSError, StorageError: It cannot be read (access denied, retries exhausted...).
    """
    if not is_url(path):
        return Path(path).read_bytes()
    location = parse_location(path, "path")
    if not isinstance(location, RemoteLocation) or not location.prefix:
        raise ValueError(f"path {path!r} names no object (expected SCHEME://BUCKET/KEY)")
    return object_store(location).read_bytes(location.prefix)


def list_tree(location: RemoteLocation) -> dict[str, ListedObject]:
    """``{relative name: (size, version)}`` of every object under ``location`` (the store pages
    through the listing), names relative to it, ``/``-separated; folder markers (keys
    ending in ``/``) are left out.

    Raises:
        StorageError: The listing is refused or fails.
    """
    prefix = f"{location.prefix}/" if location.prefix else ""
    found = object_store(location).list(prefix)
    return {
        key[len(prefix) :]: listed
        for key, listed in found.items()
        if key.startswith(prefix) and not key.endswith("/") and len(key) > len(prefix)
    }

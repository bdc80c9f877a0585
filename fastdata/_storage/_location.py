"""Where a shard set lives: a local path, or an object-store URL resolved by its scheme.

This module is the one place in the library that tells a URL from a path. A location
string with ``scheme://`` is a URL; its scheme must be registered (``s3``, whose
client comes with the ``[s3]`` extra; ``gs``, with the ``[gcs]`` extra). Anything else is
a local path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# scheme -> "module:factory" of its client (an ObjectStore of one bucket), imported on first use
SCHEMES: dict[str, str] = {
    "s3": "fastdata._storage._s3:S3Store",
    "gs": "fastdata._storage._gcs:GCSStore",
}

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


@dataclass(frozen=True)
class RemoteLocation:
    """An object-store location: ``scheme://bucket/prefix`` (the prefix has no slashes at
    either end; ``""`` for the bucket's root)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/") + "/"

    def key(self, name: str) -> str:
        """The object key of ``name`` (a plain file name) under this prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, name: str) -> str:
        """The URL of ``name`` under this location."""
        return f"{self.scheme}://{self.bucket}/{self.key(name)}"

    def __str__(self) -> str:
        return self.url


Location = Path | RemoteLocation


def is_url(value: object) -> bool:
    """True when ``value`` is a string of the form ``scheme://...``."""
    return isinstance(value, str) and _URL.match(value) is not None


def parse_location(
    value: str | os.PathLike[str] | RemoteLocation, argument: str = "path"
) -> Location:
    """A local :class:`~pathlib.Path`, or a :class:`RemoteLocation` for a supported URL.

    Raises:
        TypeError: ``value`` is neither a string nor a path.
        ValueError: ``value`` is a URL whose scheme is not supported, or has no bucket.
    """
    if isinstance(value, RemoteLocation):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a path or a URL, got {type(value).__name__}")
    if not isinstance(value, str):
        return Path(value)
    match = _URL.match(value)
    if match is None:
        return Path(value)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme not in SCHEMES:
        supported = ", ".join(f"{s}://" for s in SCHEMES)
        raise ValueError(
            f"{argument} {value!r} has the scheme {scheme}://, which is not supported "
            f"(supported: a local path, {supported})"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(
            f"{argument} {value!r} names no bucket (expected {scheme}://BUCKET/PREFIX)"
        )
    return RemoteLocation(scheme, bucket, prefix.strip("/"))

"""The exceptions fastdata raises. Every one derives from :class:`FastDataError`."""

from __future__ import annotations

from pathlib import Path


class FastDataError(Exception):
    """Base class of every error fastdata raises on purpose."""


class ShardFormatError(FastDataError):
    """A shard or manifest on disk is missing, corrupt, or not of a version we read.

    Attributes:
        path: The file that is wrong.
        index: The sample index concerned, when the problem is one sample's.
    """

    def __init__(self, message: str, path: str | Path, index: int | None = None) -> None:
        self.path = Path(path)
        self.index = index
        where = f"{self.path}" if index is None else f"{self.path} (sample {index})"
        super().__init__(f"{message}: {where}")


class DecodeError(FastDataError):
    """One sample could not be decoded (corrupt, truncated or not an image).

    Attributes:
        source: What was being decoded: a file path or a ``shard:index`` description.
    """

    def __init__(self, message: str, source: str) -> None:
        self.source = source
        super().__init__(f"{message}: {source}")


class PreprocessError(FastDataError):
    """A preprocessing job cannot run or cannot go on (bad source, bad options, full disk)."""


class InsufficientMemoryError(FastDataError):
    """Loading would need more memory than is available (both figures are in the message)."""

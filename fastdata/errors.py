"""The exceptions fastdata raises (every one derives from :class:`FastDataError`) and
:class:`OnError`, the one policy for a sample that cannot be read or decoded."""

from __future__ import annotations

import logging
import warnings
from enum import Enum
from pathlib import Path
from typing import Any, Literal, get_args

logger = logging.getLogger(__name__)

DecodeReason = Literal[
    "empty", "truncated", "corrupt", "too_large", "not_an_image", "mismatch", "bad_annotation"
]
DECODE_REASONS: tuple[str, ...] = get_args(DecodeReason)
# Spellings of earlier releases: refused, with the one to use now.
_FORMER_SPELLINGS = {"fail": "raise"}


class FastDataError(Exception):
    """Base class of every error fastdata raises on purpose."""


class ShardFormatError(FastDataError):
    """A shard or manifest on disk is missing, corrupt, or not of a version we read.

    Attributes:
        path: The file that is wrong.
        index: The sample index concerned, when the problem is one sample's.
    """

    def __init__(self, message: str, path: str | Path, index: int | None = None) -> None:
        from fastdata._storage import is_url  # noqa: PLC0415 (errors load first)

        # a URL stays a string (a Path would fold its "//")
        self.path: Path | str = path if isinstance(path, str) and is_url(path) else Path(path)
        self.index = index
        where = f"{self.path}" if index is None else f"{self.path} (sample {index})"
        super().__init__(f"{message}: {where}")


class DecodeError(FastDataError):
    """One sample could not be decoded (corrupt, truncated or not an image).

    ``str(error)`` is ``"<message>: <source>"``. What happens next is the caller's
    :class:`OnError` policy.

    Args:
        message: What is wrong, for people (without the source).
        source: What was being decoded: a file path or a ``shard:index`` description.
        reason: The kind of failure, for programs (see ``reason`` below; default
            ``"corrupt"``).
        kept: The sample was kept despite the failure (see ``kept`` below).

    Attributes:
        message: What is wrong, for people, e.g. ``"corrupt or truncated JPEG (...)"``.
        source: What was being decoded: a file path or a ``shard:index`` description.
        reason: One of :data:`DECODE_REASONS`: ``"empty"`` (no bytes), ``"truncated"``
            (the data ends before the image does), ``"corrupt"`` (damaged data a decoder
            refused), ``"too_large"`` (the header claims more pixels than ``max_pixels``
            allows), ``"not_an_image"`` (no decoder recognises the bytes, or the file is
            not of a kind the caller takes, such as an RGB mask), ``"mismatch"`` (decodable,
            but not the size, shape or dtype its record says), ``"bad_annotation"`` (the
            image is fine, its boxes are not: NaN, negative size, outside the image, or as
            many labels as boxes missing).
        kept: ``True`` for a damaged image that decoded and was kept (``on_error="warn"``:
            libjpeg warned about its data); the error then only reports it.

    Raises:
        ValueError: ``reason`` is not one of :data:`DECODE_REASONS`.
    """

    def __init__(
        self, message: str, source: str, reason: DecodeReason = "corrupt", *, kept: bool = False
    ) -> None:
        if reason not in DECODE_REASONS:
            raise ValueError(f"reason must be one of {DECODE_REASONS}, got {reason!r}")
        self.message = message
        self.source = source
        self.reason: DecodeReason = reason
        self.kept = kept
        super().__init__(f"{message}: {source}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (DataLoader and preprocessing workers).
        return _rebuild_decode_error, (
            type(self),
            self.message,
            self.source,
            self.reason,
            self.kept,
        )

    def with_source(self, source: str) -> DecodeError:
        """The same failure described at ``source`` (e.g. a ``shard:index`` instead of the
        field name the decoder saw), chained to this one.

        Args:
            source: Where the sample is, as the caller's users know it.
        """
        error = DecodeError(self.message, source, self.reason, kept=self.kept)
        error.__cause__ = self
        return error


def _rebuild_decode_error(
    kind: type[DecodeError], message: str, source: str, reason: DecodeReason, kept: bool
) -> DecodeError:
    return kind(message, source, reason, kept=kept)


class PreprocessError(FastDataError):
    """A preprocessing job cannot run or cannot go on (bad source, bad options, full disk)."""


class StorageError(FastDataError):
    """An object store refused or failed a request (no such bucket, access denied, wrong
    region, or a transient failure that outlasted the retries). The message is one line
    and never holds credentials.

    Attributes:
        transient: Whether the failure may pass on a later attempt (a 5xx, a reset).
        corrupt: The body arrived damaged (the client's checksum of it disagreed).
    """

    transient: bool = False
    corrupt: bool = False


class InsufficientMemoryError(FastDataError):
    """Loading would need more memory than is available (both figures are in the message)."""


class OnError(str, Enum):
    """What to do with one sample that cannot be read or decoded: the ``on_error``
    argument of datasets, decoders and preprocessing (``--on-error`` on the command line).

    - ``"raise"``: stop, raising the error (a
      :class:`DecodeError`; a preprocessing job stops with a :class:`PreprocessError`).
    - ``"warn"``: leave the sample out and report it: a ``RuntimeWarning``
      ``"skipped a sample: ..."`` (preprocessing: a log record at WARNING level, which the
      command line prints).
    - ``"skip"``: leave the sample out quietly (a log record at DEBUG level only).

    A batch that lost samples is smaller; preprocessing records every input it left out in
    the manifest's ``skipped`` list, whichever of ``"warn"`` and ``"skip"``. Arguments
    accept the member or its string.

    A JPEG whose data is damaged but decodes (libjpeg warns and makes up the rest of the
    image) is an error under ``"raise"`` and left out under ``"skip"``; ``"warn"`` keeps
    it and reports it (``"kept a damaged sample: ..."``). Data that ends early is an error
    under every policy.
    """

    RAISE = "raise"
    WARN = "warn"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def spellings(cls) -> tuple[str, ...]:
        """Every string :meth:`parse` accepts (the command line's ``--on-error`` choices)."""
        return tuple(member.value for member in cls)

    @classmethod
    def parse(cls, value: OnError | str, name: str = "on_error") -> OnError:
        """The policy a user's ``value`` names.

        Args:
            value: An :class:`OnError`, ``"raise"``, ``"warn"`` or ``"skip"``.
            name: The argument's name, for the error message.

        Raises:
            TypeError: ``value`` is not a string.
            ValueError: ``value`` is not one of the spellings above (the message names the
                spelling to use for a former one, such as ``"fail"``).
        """
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        try:
            return cls(value)
        except ValueError:
            former = _FORMER_SPELLINGS.get(value)
            hint = f" (now spelled {former!r})" if former else ""
            raise ValueError(
                f"{name} must be one of {cls.spellings()}, got {value!r}{hint}"
            ) from None

    def handle(
        self, error: Exception, *, log: logging.Logger | None = None, stacklevel: int = 1
    ) -> None:
        """Apply the policy to one sample's ``error``: raise it, or return (the caller then
        leaves the sample out) after reporting it as the policy says.

        Args:
            error: Why the sample failed; its text follows ``"skipped a sample: "``.
            log: Report ``"warn"`` as a WARNING record here instead of a warning (jobs
                whose reports are log lines, such as preprocessing).
            stacklevel: The warning's stack level as seen from the caller (1: the line that
                called this method).

        A :class:`DecodeError` whose ``kept`` is true is a damaged sample the caller kept
        (under ``"warn"`` only): it is reported as kept, never raised.

        Raises:
            Exception: ``error`` itself, under ``"raise"``.
        """
        if isinstance(error, DecodeError) and error.kept:
            if self is OnError.WARN and log is not None:
                log.warning("kept a damaged sample: %s", error)
            elif self is OnError.WARN:
                message = f"kept a damaged sample: {error}"
                warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
            return
        if self is OnError.RAISE:
            raise error
        if self is OnError.SKIP:
            (log or logger).debug("skipped a sample: %s", error)
        elif log is not None:
            log.warning("skipped a sample: %s", error)
        else:
            warnings.warn(f"skipped a sample: {error}", RuntimeWarning, stacklevel=stacklevel + 1)

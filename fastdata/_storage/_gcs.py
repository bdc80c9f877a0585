"""Google Cloud Storage (``gs://``) through google-cloud-storage, its own client library.

Configuration is the library's standard chain: Application Default Credentials
(``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the
metadata server of a Google Cloud machine), and ``STORAGE_EMULATOR_HOST`` for a local
emulator (then anonymous). The project is not needed to read and write objects.

As for ``s3://`` (see :mod:`fastdata._storage._s3`): each process creates its own client;
every request has a timeout and is retried with exponential backoff on transient errors
(5xx, 408, 429, resets, truncated bodies); the rest is one line of
:class:`~fastdata.errors.StorageError`, and a missing object is ``FileNotFoundError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fastdata._optional import import_optional
from fastdata._storage._backend import ListedObject, retrying
from fastdata._storage._s3 import ATTEMPTS_ENV, TIMEOUT_ENV, _env_int, scrub
from fastdata.errors import StorageError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_CHUNK_BYTES = 1 << 20
_WHY = "reading gs:// locations"
_DENIED = "access denied (check the credentials and the bucket's permissions)"


class GCSStore:
    """One bucket of Google Cloud Storage (see the module docstring)."""

    def __init__(self, bucket: str) -> None:
        storage = import_optional("google.cloud.storage", _WHY)
        self._exceptions = import_optional("google.api_core.exceptions", _WHY)
        self._auth_exceptions = import_optional("google.auth.exceptions", _WHY)
        self.bucket = bucket
        self.attempts = _env_int(ATTEMPTS_ENV, 5)
        self.timeout_s = _env_int(TIMEOUT_ENV, 60)
        self._client = storage.Client(project="<none>")  # objects only: no project needed
        self._bucket = self._client.bucket(bucket)

    # -- the ObjectStore interface -------------------------------------------------------
    def read_bytes(self, key: str) -> bytes:
        def read() -> bytes:
            data: bytes = self._blob(key).download_as_bytes(timeout=self.timeout_s, retry=None)
            return data

        return self._retrying("read", key, lambda: self._missing_raises(read, key))

    def stream(self, key: str) -> Iterator[memoryview]:
        """The object's body in chunks, as they arrive (its reader checks it: the cache,
        against the manifest's SHA-256)."""
        try:
            with self._blob(key).open(
                "rb", chunk_size=_CHUNK_BYTES, timeout=self.timeout_s, retry=None
            ) as body:
                while chunk := body.read(_CHUNK_BYTES):
                    yield memoryview(chunk)
        except self._exceptions.NotFound:
            raise self._not_found(key) from None
        except Exception as exc:
            raise self.error("read", f"gs://{self.bucket}/{key}", exc) from None

    def size(self, key: str) -> int | None:
        blob = self._retrying("look up", key, lambda: self._lookup(key))
        return None if blob is None else int(blob.size)

    def upload(self, path: Path, key: str, metadata: dict[str, str] | None = None) -> None:
        def put() -> None:
            blob = self._blob(key)
            blob.metadata = metadata or None
            blob.upload_from_filename(str(path), timeout=self.timeout_s, retry=None)

        self._retrying("upload", key, put)

    def metadata(self, key: str) -> dict[str, str]:
        blob = self._retrying("look up", key, lambda: self._lookup(key))
        return {} if blob is None else dict(blob.metadata or {})

    def write_bytes(self, key: str, data: bytes) -> None:
        self._retrying(
            "write",
            key,
            lambda: self._blob(key).upload_from_string(data, timeout=self.timeout_s, retry=None),
        )

    def list(self, prefix: str) -> dict[str, ListedObject]:
        def listing() -> dict[str, ListedObject]:
            blobs = self._client.list_blobs(
                self.bucket, prefix=prefix, timeout=self.timeout_s, retry=None
            )
            return {
                str(blob.name): ListedObject(int(blob.size), f"{blob.generation}:{blob.etag}")
                for blob in blobs
            }

        return self._retrying("list", prefix, listing)

    def delete(self, key: str) -> None:
        def remove() -> None:
            try:
                self._blob(key).delete(timeout=self.timeout_s, retry=None)
            except self._exceptions.NotFound:
                self._check_bucket(key)

        self._retrying("delete", key, remove)

    # -- helpers -------------------------------------------------------------------------
    def _blob(self, key: str) -> Any:
        return self._bucket.blob(key)

    def _lookup(self, key: str) -> Any:
        """The object's record (size, metadata), ``None`` when there is no such object."""
        blob = self._bucket.get_blob(key, timeout=self.timeout_s, retry=None)
        if blob is None:
            self._check_bucket(key)
        return blob

    def _missing_raises(self, call: Callable[[], _T], key: str) -> _T:
        try:
            return call()
        except self._exceptions.NotFound:
            raise self._not_found(key) from None

    def _not_found(self, key: str) -> Exception:
        """``FileNotFoundError`` for a missing object; the bucket's own error when it is
        the bucket that is missing."""
        try:
            self._check_bucket(key)
        except StorageError as exc:
            return exc
        return FileNotFoundError(f"no such object: gs://{self.bucket}/{key}")

    def _check_bucket(self, key: str) -> None:
        if not self._client.lookup_bucket(self.bucket, timeout=self.timeout_s, retry=None):
            raise StorageError(f"cannot read gs://{self.bucket}/{key}: no such bucket")

    # -- retries and errors --------------------------------------------------------------
    def transient(self, exc: BaseException) -> bool:
        """Whether retrying ``exc`` may succeed (not refusals, missing objects, bad config)."""
        if isinstance(exc, FileNotFoundError | StorageError):
            return False
        if isinstance(exc, self._exceptions.GoogleAPICallError):
            status = int(getattr(exc, "code", 0) or 0)
            return status >= 500 or status in (408, 429)
        return not isinstance(exc, self._auth_exceptions.DefaultCredentialsError | ValueError)

    def _retrying(self, what: str, key: str, call: Callable[[], _T]) -> _T:
        return retrying(self, what, f"gs://{self.bucket}/{key}", call)

    def reason(self, exc: BaseException) -> str:
        """A one-line reason for ``exc``, without credentials or query strings."""
        if isinstance(exc, self._exceptions.Forbidden | self._exceptions.Unauthorized):
            reason = f"{_DENIED} (HTTP {exc.code})"
        elif isinstance(exc, self._exceptions.GoogleAPICallError):
            reason = f"HTTP {exc.code}: {' '.join(str(exc.message).split())}"
        elif isinstance(exc, self._auth_exceptions.DefaultCredentialsError):
            reason = (
                "no credentials found (set GOOGLE_APPLICATION_CREDENTIALS, or run "
                "`gcloud auth application-default login`)"
            )
        else:
            text = " ".join(str(exc).split()) or type(exc).__name__
            reason = f"{type(exc).__name__}: {text}"
        return scrub(reason)[:300]

    def error(self, what: str, url: str, exc: BaseException) -> Exception:
        """The one-line error of a request that failed for good."""
        if isinstance(exc, FileNotFoundError | StorageError):
            return exc
        error = StorageError(f"cannot {what} {url}: {self.reason(exc)}")
        error.transient = self.transient(exc)
        return error

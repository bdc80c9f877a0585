"""S3-protocol object stores (AWS S3, MinIO, Ceph, R2, ...) through ``obstore``.

Configuration is the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``/``AWS_REGION``,
``AWS_ENDPOINT_URL``) plus what obstore's credential chain finds (web identity, container
and instance metadata). An ``http://`` endpoint (a local test server, MinIO) is allowed.

Every request has a timeout and is retried with exponential backoff on transient errors
(5xx, throttling, resets, truncated bodies); the rest is one line of
:class:`~fastdata.errors.StorageError` that never holds credentials.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fastdata._optional import import_optional
from fastdata.errors import StorageError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Environment knobs, read when a process creates its client (workers inherit them).
ATTEMPTS_ENV = "FASTDATA_STORAGE_ATTEMPTS"  # whole-request attempts, default 5
TIMEOUT_ENV = "FASTDATA_STORAGE_TIMEOUT_S"  # per request, default 60 s
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

# S3 error codes that retrying cannot fix -> what the user reads
_PERMANENT = {
    "NoSuchBucket": "no such bucket",
    "AccessDenied": "access denied (check the credentials and the bucket policy)",
    "AllAccessDisabled": "access denied (check the credentials and the bucket policy)",
    "InvalidAccessKeyId": "the access key id is not known to this endpoint",
    "SignatureDoesNotMatch": "the secret key does not match the access key id",
    "ExpiredToken": "the session token has expired",
    "PermanentRedirect": "wrong region: the bucket is in another region (set AWS_REGION)",
    "AuthorizationHeaderMalformed": "wrong region: the bucket is in another region "
    "(set AWS_REGION)",
    "IllegalLocationConstraintException": "wrong region (set AWS_REGION)",
    "InvalidBucketName": "invalid bucket name",
}
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_STATUS = re.compile(r"status code: (\d{3})[^:\n]*")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else default


class S3Store:
    """One bucket of an S3-protocol store (see the module docstring)."""

    def __init__(self, bucket: str) -> None:
        obstore_store = import_optional("obstore.store", "reading s3:// locations")
        self._obstore = import_optional("obstore", "reading s3:// locations")
        self._errors = import_optional("obstore.exceptions", "reading s3:// locations")
        self.bucket = bucket
        self.attempts = _env_int(ATTEMPTS_ENV, 5)
        timeout_s = _env_int(TIMEOUT_ENV, 60)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        options: dict[str, Any] = {
            "timeout": f"{timeout_s}s",
            "connect_timeout": f"{min(timeout_s, 10)}s",
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
        }
        config: dict[str, Any] = {}
        if endpoint:
            config["endpoint"] = endpoint
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            config["region"] = region
        # obstore retries 5xx/429/connection errors inside one call; a failure in the middle
        # of a body is retried here, by the whole request.
        retry = {
            "max_retries": 3,
            "backoff": {
                "init_backoff": datetime.timedelta(milliseconds=100),
                "max_backoff": datetime.timedelta(seconds=5),
                "base": 2,
            },
            "retry_timeout": datetime.timedelta(seconds=timeout_s),
        }
        self._store = obstore_store.S3Store(
            bucket, config=config, client_options=options, retry_config=retry
        )

    # -- the ObjectStore interface -------------------------------------------------------
    def read_bytes(self, key: str) -> bytes:
        return self._retrying(
            "read", key, lambda: bytes(self._obstore.get(self._store, key).bytes())
        )

    def stream(self, key: str) -> Iterator[memoryview]:
        try:
            result = self._obstore.get(self._store, key)
            for chunk in result.stream(min_chunk_size=1 << 20):
                yield memoryview(chunk)
        except Exception as exc:
            raise self._error("read", key, exc) from None

    def size(self, key: str) -> int | None:
        def head() -> int | None:
            try:
                return int(self._obstore.head(self._store, key)["size"])
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc):
                    raise
                return None

        return self._retrying("look up", key, head)

    def upload(self, path: Path, key: str) -> None:
        self._retrying("upload", key, lambda: self._obstore.put(self._store, key, Path(path)))

    def write_bytes(self, key: str, data: bytes) -> None:
        self._retrying("write", key, lambda: self._obstore.put(self._store, key, data))

    def list(self, prefix: str) -> dict[str, int]:
        def listing() -> dict[str, int]:
            found: dict[str, int] = {}
            for batch in self._obstore.list(self._store, prefix):
                for meta in batch:
                    found[str(meta["path"])] = int(meta["size"])
            return found

        return self._retrying("list", prefix, listing)

    def delete(self, key: str) -> None:
        self._retrying("delete", key, lambda: self._obstore.delete(self._store, key))

    # -- retries and errors --------------------------------------------------------------
    def transient(self, exc: BaseException) -> bool:
        """Whether retrying ``exc`` may succeed (not for refusals and missing objects)."""
        if isinstance(exc, FileNotFoundError | StorageError):
            return False
        permanent = (
            self._errors.PermissionDeniedError,
            self._errors.UnauthenticatedError,
            self._errors.InvalidPathError,
            self._errors.UnknownConfigurationKeyError,
        )
        if isinstance(exc, permanent):
            return False
        code = _CODE.search(str(exc))
        return not (code and code.group(1) in _PERMANENT)

    def _retrying(self, what: str, key: str, call: Callable[[], _T]) -> _T:
        """``call()``, retried with exponential backoff and jitter on transient errors."""
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except Exception as exc:
                if isinstance(exc, FileNotFoundError) and "NoSuchBucket" not in str(exc):
                    raise FileNotFoundError(f"no such object: s3://{self.bucket}/{key}") from None
                if attempt == self.attempts or not self.transient(exc):
                    raise self._error(what, key, exc) from None
                delay = min(5.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random())
                logger.info(
                    "retrying %s of s3://%s/%s in %.1f s (%s)",
                    what, self.bucket, key, delay, self.reason(exc),
                )  # fmt: skip
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def reason(self, exc: BaseException) -> str:
        """A one-line reason for ``exc``, with any credential of the environment removed."""
        text = str(exc)
        code = _CODE.search(text)
        if code:
            reason = _PERMANENT.get(code.group(1), code.group(1))
            status = _STATUS.search(text)
            if status is not None:
                reason = f"{reason} (HTTP {status.group(1)})"
        elif isinstance(exc, self._errors.PermissionDeniedError):
            reason = "access denied (check the credentials and the bucket policy)"
        elif isinstance(exc, self._errors.UnauthenticatedError):
            reason = "not authenticated (check the credentials)"
        else:
            status = _STATUS.search(text)
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            reason = f"HTTP {status.group(1)}" if status else first
        return scrub(reason)[:300]

    def _error(self, what: str, key: str, exc: BaseException) -> Exception:
        if isinstance(exc, FileNotFoundError) and "NoSuchBucket" not in str(exc):
            return FileNotFoundError(f"no such object: s3://{self.bucket}/{key}")
        error = StorageError(f"cannot {what} s3://{self.bucket}/{key}: {self.reason(exc)}")
        error.transient = self.transient(exc)
        return error


def scrub(text: str) -> str:
    """``text`` without the credentials of the environment or URL query strings (which
    may carry a presigned signature)."""
    for name in _SECRET_ENV:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"\?[^\s]*", "", text)

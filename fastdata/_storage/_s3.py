"""S3-protocol object stores (AWS S3, MinIO, Ceph, R2, ...) through boto3.

Configuration is boto3's standard chain: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and ``~/.aws/config``, ``AWS_REGION``/
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` (an S3-compatible store, or a local server over
``http://``), web identity, container and instance credentials.

Each process creates its own client (DataLoader workers are forked: a client, or any
client library with its own threads, does not survive a fork). Every request has a
timeout and is retried with exponential backoff on transient errors (5xx, throttling,
resets, truncated bodies); the rest is one line of :class:`~fastdata.errors.StorageError`
that never holds credentials.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fastdata._optional import import_optional
from fastdata._storage._backend import ListedObject, retrying
from fastdata.errors import StorageError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Environment knobs, read when a process creates its client (workers inherit them).
ATTEMPTS_ENV = "FASTDATA_STORAGE_ATTEMPTS"  # attempts of a request, default 5
TIMEOUT_ENV = "FASTDATA_STORAGE_TIMEOUT_S"  # connect and read timeout, default 60 s
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# A read of the body, into one reused buffer per thread. Small enough to stay in the CPU's
# cache between the read, the SHA-256 and the write to the cache file: with 8 MiB chunks
# each pass went through memory (measured in docs/benchmarks.md, storage section).
_CHUNK_BYTES = 256 << 10

# S3 error codes that retrying cannot fix -> what the user reads
_WRONG_REGION = "wrong region: the bucket is in another region (set AWS_REGION)"
_DENIED = "access denied (check the credentials and the bucket policy)"
_PERMANENT = {
    "NoSuchBucket": "no such bucket",
    "AccessDenied": _DENIED,
    "AllAccessDisabled": _DENIED,
    "403": _DENIED,
    "Forbidden": _DENIED,
    "InvalidAccessKeyId": "the access key id is not known to this endpoint",
    "SignatureDoesNotMatch": "the secret key does not match the access key id",
    "ExpiredToken": "the session token has expired",
    "PermanentRedirect": _WRONG_REGION,
    "301": _WRONG_REGION,
    "AuthorizationHeaderMalformed": _WRONG_REGION,
    "IllegalLocationConstraintException": _WRONG_REGION,
    "InvalidBucketName": "invalid bucket name",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else default


# botocore's loader of its service descriptions (by data path), shared by the clients of
# this process and of the processes it forks (DataLoader workers): plain parsed JSON, no
# threads, sockets or credentials. A client made with a loader that has them parsed costs
# about 0.01 s of CPU; with a new one, 0.07 s in the parent and 0.2 s in a forked worker.
_loaders: dict[str, Any] = {}


def _session(boto3: Any) -> Any:
    """A new boto3 session (its own credentials and configuration, read from the
    environment now) on the shared loader of service descriptions."""
    botocore_session = import_optional("botocore.session", "reading s3:// locations")
    session = botocore_session.get_session()
    data_path = str(session.get_config_variable("data_path"))
    loader = _loaders.get(data_path)
    if loader is None:
        loader = _loaders[data_path] = session.get_component("data_loader")
    else:
        session.register_component("data_loader", loader)
    shared = boto3.session.Session(botocore_session=session)
    loader.search_paths[:] = dict.fromkeys(loader.search_paths)  # boto3 adds its folder again
    return shared


class S3Store:
    """One bucket of an S3-protocol store (see the module docstring)."""

    def __init__(self, bucket: str) -> None:
        boto3 = import_optional("boto3", "reading s3:// locations")
        config = import_optional("botocore.config", "reading s3:// locations")
        self._exceptions = import_optional("botocore.exceptions", "reading s3:// locations")
        self.bucket = bucket
        self.attempts = _env_int(ATTEMPTS_ENV, 5)
        timeout_s = _env_int(TIMEOUT_ENV, 60)
        settings: dict[str, Any] = {
            "connect_timeout": min(timeout_s, 10),
            "read_timeout": timeout_s,
            # retried here, whole requests with their bodies (a body can fail midway)
            "retries": {"max_attempts": 1, "mode": "standard"},
            "max_pool_connections": 16,
            # the client checks a body's CRC only where asked (ChecksumMode): shards are
            # checked against the manifest's SHA-256 already, other reads ask for it
            "response_checksum_validation": "when_required",
        }
        try:
            client_config = config.Config(**settings)
        except TypeError:  # botocore before 1.36: no such setting, and no such check
            del settings["response_checksum_validation"]
            client_config = config.Config(**settings)
        self._client = _session(boto3).client("s3", config=client_config)

    # -- the ObjectStore interface -------------------------------------------------------
    def read_bytes(self, key: str) -> bytes:
        return self._retrying("read", key, lambda: self._get(key, verify=True).read())

    def stream(self, key: str) -> Iterator[memoryview]:
        """The object's body in chunks, not checked by the client: its reader checks it
        (the cache, against the manifest's SHA-256). Each chunk is a view of one reused
        buffer, valid until the next chunk is asked for."""
        body = None
        try:
            body = self._get(key, verify=False)
            yield from _chunks(body)
            _release_connection(body)
        except Exception as exc:
            raise self.error("read", f"s3://{self.bucket}/{key}", exc) from None
        finally:
            if body is not None:
                body.close()  # a connection not given back (a body left unread) is closed

    def size(self, key: str) -> int | None:
        def head() -> int | None:
            try:
                return int(self._client.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
            except self._exceptions.ClientError as exc:
                if _code(exc) in _MISSING:
                    return None
                raise

        return self._retrying("look up", key, head)

    def upload(self, path: Path, key: str, metadata: dict[str, str] | None = None) -> None:
        def put() -> None:
            with open(path, "rb") as body:
                self._client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, Metadata=metadata or {}
                )

        self._retrying("upload", key, put)

    def metadata(self, key: str) -> dict[str, str]:
        def head() -> dict[str, str]:
            try:
                response = self._client.head_object(Bucket=self.bucket, Key=key)
            except self._exceptions.ClientError as exc:
                if _code(exc) in _MISSING:
                    return {}
                raise
            return dict(response.get("Metadata", {}))

        return self._retrying("look up", key, head)

    def write_bytes(self, key: str, data: bytes) -> None:
        self._retrying(
            "write", key, lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        )

    def list(self, prefix: str) -> dict[str, ListedObject]:
        def listing() -> dict[str, ListedObject]:
            found: dict[str, ListedObject] = {}
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    stamp = f"{item.get('ETag', '')}@{item.get('LastModified', '')}"
                    found[str(item["Key"])] = ListedObject(int(item["Size"]), stamp)
            return found

        return self._retrying("list", prefix, listing)

    def delete(self, key: str) -> None:
        self._retrying(
            "delete", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=key)
        )

    def _get(self, key: str, verify: bool) -> Any:
        """The body of ``key``; ``verify``: the client checks it against the checksum the
        store sent, if any."""
        extra = {"ChecksumMode": "ENABLED"} if verify else {}
        try:
            return self._client.get_object(Bucket=self.bucket, Key=key, **extra)["Body"]
        except self._exceptions.ClientError as exc:
            if _code(exc) in _MISSING:
                raise FileNotFoundError(f"no such object: s3://{self.bucket}/{key}") from None
            raise

    # -- retries and errors --------------------------------------------------------------
    def transient(self, exc: BaseException) -> bool:
        """Whether retrying ``exc`` may succeed (not refusals, missing objects, bad config)."""
        if isinstance(exc, FileNotFoundError | StorageError):
            return False
        if isinstance(exc, self._exceptions.ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            return _code(exc) not in _PERMANENT and (status >= 500 or status in (408, 429))
        return not isinstance(
            exc, self._exceptions.NoCredentialsError | self._exceptions.ParamValidationError
        )

    def _retrying(self, what: str, key: str, call: Callable[[], _T]) -> _T:
        return retrying(self, what, f"s3://{self.bucket}/{key}", call)

    def reason(self, exc: BaseException) -> str:
        """A one-line reason for ``exc``, with any credential of the environment removed."""
        if isinstance(exc, self._exceptions.ClientError):
            code = _code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            reason = _PERMANENT.get(code, code)
            reason = f"{reason} (HTTP {status})" if status else reason
        elif isinstance(exc, self._exceptions.NoCredentialsError):
            reason = "no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
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
        # the client's own checksum of the body (CRC, when the store sent one) disagreed
        error.corrupt = isinstance(exc, self._exceptions.FlexibleChecksumError)
        return error


_buffers = threading.local()


def _chunks(body: Any) -> Iterator[memoryview]:
    """The bytes of a response body, read straight from the socket into one reused buffer
    (no copy per chunk): a body the server sent compressed (``Content-Encoding``), or a
    client library of another make, is read through the library's own chunks instead."""
    raw = getattr(body, "_raw_stream", None)
    socket_file: Any = getattr(raw, "_fp", None)
    encoding = str(getattr(raw, "headers", {}).get("content-encoding", "identity")).lower()
    if not hasattr(socket_file, "readinto") or encoding not in ("", "identity"):
        for chunk in body.iter_chunks(_CHUNK_BYTES):
            yield memoryview(chunk)
        return
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:  # one per thread: a download's chunks are used before the next read
        buffer = _buffers.buffer = memoryview(bytearray(_CHUNK_BYTES))
    while True:
        # http.client's reader: it raises IncompleteRead for a body cut short of its
        # Content-Length (a truncated download, retried), returns 0 at its end
        count = socket_file.readinto(buffer)
        if not count:
            return
        yield buffer[:count]


def _release_connection(body: Any) -> None:
    """Give the connection of a body read to its end back to the client's pool. Read
    straight from the socket (:func:`_chunks`), the body bypasses urllib3's reader, which
    does that at the end of a body: closing it then closed the connection, and each GET
    paid a new one (a TCP handshake, behind a store's latency)."""
    raw = getattr(body, "_raw_stream", None)
    socket_file = getattr(raw, "_fp", None)
    release = getattr(raw, "release_conn", None)
    isclosed = getattr(socket_file, "isclosed", None)
    # only a response read to its end (http.client closes it there): the connection is
    # then ready for the next request
    if callable(release) and callable(isclosed) and isclosed():
        release()


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def scrub(text: str) -> str:
    """``text`` without the credentials of the environment or URL query strings (which
    may carry a presigned signature)."""
    for name in _SECRET_ENV:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"\?[^\s]*", "", text)

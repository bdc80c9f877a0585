"""The small interface every object-store client implements, and the registry by scheme."""

from __future__ import annotations

import importlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

from fastdata._storage._location import SCHEMES, RemoteLocation

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class ListedObject(NamedTuple):
    """An object as a listing shows it."""

    size: int
    version: str  # changes when the object is replaced (ETag and time, or generation)


class ObjectStore(Protocol):
    """Whole-object reads and writes in one bucket, by key.

    Implementations retry transient failures themselves (with backoff and a timeout) and
    raise :class:`~fastdata.errors.StorageError` (one line, no credentials) for the rest;
    a missing object is ``FileNotFoundError``.
    """

    def read_bytes(self, key: str) -> bytes:
        """The whole object."""
        ...

    def stream(self, key: str) -> Iterator[memoryview]:
        """The object's bytes in chunks, as they arrive (one request)."""
        ...

    def size(self, key: str) -> int | None:
        """The object's size in bytes, ``None`` when there is no such object."""
        ...

    def upload(self, path: Path, key: str, metadata: dict[str, str] | None = None) -> None:
        """Store the file ``path`` as ``key`` (replaced whole, never seen half-written),
        with user ``metadata``."""
        ...

    def metadata(self, key: str) -> dict[str, str]:
        """The user metadata stored with ``key`` (empty when there is no such object)."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` as ``key``."""
        ...

    def list(self, prefix: str) -> dict[str, ListedObject]:
        """Every object under ``prefix``: ``{key: (size, version stamp)}``."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error when it is absent)."""
        ...


# one client per (scheme, bucket) and process: clients hold connection pools and threads,
# which neither pickle nor survive a fork
_clients: dict[tuple[int, str, str], ObjectStore] = {}
_clients_lock = threading.Lock()


def _forget_clients() -> None:  # a forked child starts with no client and a free lock
    global _clients_lock  # noqa: PLW0603 (replaced, not shared: the parent's may be held)
    _clients.clear()
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_clients)


def object_store(location: RemoteLocation) -> ObjectStore:
    """The client of ``location``'s bucket in this process (created on first use).

    Raises:
        ModuleNotFoundError: The scheme's client library is missing (names the pip command).
    """
    key = (os.getpid(), location.scheme, location.bucket)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            module, _, name = SCHEMES[location.scheme].partition(":")
            factory: Callable[[str], ObjectStore] = getattr(importlib.import_module(module), name)
            client = factory(location.bucket)
            _clients[key] = client
    return client


class RetryPolicy(Protocol):
    """What :func:`retrying` asks of a client."""

    attempts: int

    def transient(self, exc: BaseException) -> bool: ...

    def reason(self, exc: BaseException) -> str: ...

    def error(self, what: str, url: str, exc: BaseException) -> Exception: ...


def retrying(client: RetryPolicy, what: str, url: str, call: Callable[[], _T]) -> _T:
    """``call()``, retried with exponential backoff and jitter while ``client`` calls its
    failure transient, up to ``client.attempts``; then ``client.error(...)`` is raised (a
    missing object, ``FileNotFoundError``, at once)."""
    for attempt in range(1, client.attempts + 1):
        try:
            return call()
        except FileNotFoundError:
            raise
        except Exception as exc:
            if attempt == client.attempts or not client.transient(exc):
                raise client.error(what, url, exc) from None
            delay = min(5.0, 0.1 * 2 ** (attempt - 1)) * (0.5 + random.random())
            logger.info("retrying %s of %s in %.1f s (%s)", what, url, delay, client.reason(exc))
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover

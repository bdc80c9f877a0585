"""On-disk cache of tuning results, keyed by dataset fingerprint, batch size and host."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastdata._files import write_json_atomic
from fastdata._system import usable_cpus
from fastdata._version import __version__
from fastdata.shards import Manifest

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fastdata/autotune`` (``~/.cache/fastdata/autotune`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fastdata" / "autotune"


def dataset_fingerprint(dataset: Any) -> str:
    """What identifies a dataset's content (and cost) for the cache.

    A dataset may define ``fingerprint`` (a string, or a method returning one). Otherwise
    its class and length stand in for it, plus, where the dataset has them, the checksums
    of its shards (a ``manifest``), the ``fields`` it returns and the kind of ``transform``.
    """
    custom = getattr(dataset, "fingerprint", None)
    if callable(custom):
        custom = custom()
    if isinstance(custom, str):
        return custom
    parts = [f"{type(dataset).__module__}.{type(dataset).__qualname__}"]
    with contextlib.suppress(TypeError):  # iterable datasets may have no length
        parts.append(str(len(dataset)))
    manifest = getattr(dataset, "manifest", None)
    if isinstance(manifest, Manifest):
        parts.extend(shard.sha256 for shard in manifest.shards)
    fields = getattr(dataset, "fields", None)
    if isinstance(fields, (tuple, list)):
        parts.append(",".join(map(str, fields)))
    if getattr(dataset, "transform", None) is not None:
        parts.append(describe(dataset.transform))
    return ":".join(parts)


def describe(value: Any) -> str:
    """A description of a setting that is stable across runs (no object addresses).

    An object whose class defines its own ``repr`` without an address (fastdata's
    transforms: ``Resize(256)``) is described by it, so settings differ when parameters do.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    name = getattr(value, "__qualname__", None)
    if isinstance(name, str):
        return f"{getattr(value, '__module__', '')}.{name}"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if type(value).__repr__ is not object.__repr__:
        text = repr(value)
        if " at 0x" not in text:
            return f"{kind}:{text}"
    return kind


def cache_key(dataset: Any, batch_size: int, settings: Mapping[str, Any]) -> str:
    """A hex digest of the dataset fingerprint, batch size, host and search settings."""
    key = {
        "dataset": dataset_fingerprint(dataset),
        "batch_size": batch_size,
        "host": platform.node(),
        "cpus": usable_cpus(),
        "fastdata": __version__,
        "settings": dict(sorted(settings.items())),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def load(directory: Path, key: str) -> dict[str, Any] | None:
    """The cached result dictionary under ``key``, or ``None`` (unreadable entries too)."""
    path = directory / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable autotune cache entry %s (%s)", path, exc)
        return None
    return data if isinstance(data, dict) else None


def store(directory: Path, key: str, data: Mapping[str, Any]) -> None:
    """Write ``data`` under ``key``, with the time it was measured (``cached_at``, UTC)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    write_json_atomic(directory / f"{key}.json", {**data, "cached_at": now})

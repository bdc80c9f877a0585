"""Writing a shard set to object storage: staged locally, each shard uploaded when it is
complete, the manifest last (a reader never sees a half-written set)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from fastdata._storage._backend import object_store
from fastdata._storage._cache import default_cache_dir
from fastdata._storage._location import RemoteLocation

logger = logging.getLogger(__name__)

MANIFEST_NAME = "index.json"
_SHA_KEY = "fastdata-sha256"  # object metadata: the shard's checksum, checked on a rerun


class RemoteOutput:
    """The output of a preprocessing job in object storage.

    The job writes into :attr:`staging`, a local folder (under the cache folder) named
    after the URL, with the usual lock, job records and resume; each finished shard is
    uploaded at once, and :meth:`finish` uploads what is missing, then the manifest. A rerun
    resumes from the staging folder and keeps the objects already uploaded whose size and
    recorded SHA-256 match.
    """

    def __init__(self, location: RemoteLocation, staging_root: Path | None = None) -> None:
        self.location = location
        digest = hashlib.sha256(location.url.encode()).hexdigest()[:16]
        self.staging = (staging_root or default_cache_dir() / "staging") / digest

    def shard_done(self, path: Path, num_bytes: int, sha256: str) -> None:
        """Upload one finished shard (skipped when the bucket holds it already)."""
        store = object_store(self.location)
        key = self.location.key(path.name)
        if store.size(key) == num_bytes and store.metadata(key).get(_SHA_KEY) == sha256:
            return
        store.upload(path, key, {_SHA_KEY: sha256})

    def finish(self, shards: list[tuple[str, int, str]]) -> None:
        """Upload the shards ``(file, num_bytes, sha256)`` the bucket lacks, then the
        manifest: only then does the set exist for readers."""
        for file, num_bytes, sha256 in shards:
            self.shard_done(self.staging / file, num_bytes, sha256)
        store = object_store(self.location)
        store.upload(self.staging / MANIFEST_NAME, self.location.key(MANIFEST_NAME), {})
        logger.info("uploaded %d shard(s) and the manifest to %s", len(shards), self.location)

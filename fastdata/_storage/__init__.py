"""Where shard sets live: local paths, or object stores reached by URL scheme.

The one package of the library that knows URLs: a location resolves to a local path
(read in place, memory-mapped) or to a remote location whose shards are downloaded
whole into a bounded, verified local cache shared by the processes of a node.

A shared internal package: the shard format, preprocessing and the error messages use
it; users name a location as a path or URL (docs/guides/storage.md).
"""

from __future__ import annotations

from fastdata._storage._backend import ListedObject, object_store
from fastdata._storage._cache import HeldShard, ShardCache, default_cache_dir, parse_bytes
from fastdata._storage._files import (
    CachedFiles,
    LocalFiles,
    ShardFiles,
    read_file,
    shard_files,
)
from fastdata._storage._inputs import list_tree, read_input
from fastdata._storage._location import Location, RemoteLocation, is_url, parse_location
from fastdata._storage._upload import RemoteOutput

__all__ = [
    "CachedFiles",
    "HeldShard",
    "ListedObject",
    "LocalFiles",
    "Location",
    "RemoteLocation",
    "RemoteOutput",
    "ShardCache",
    "ShardFiles",
    "default_cache_dir",
    "is_url",
    "list_tree",
    "object_store",
    "parse_bytes",
    "parse_location",
    "read_file",
    "read_input",
    "shard_files",
]

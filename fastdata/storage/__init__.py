"""Where shard sets live: local paths, or object stores reached by URL scheme.

The one package of the library that knows URLs: a location resolves to a local path
(read in place, memory-mapped) or to a remote location whose shards are downloaded
whole into a bounded, verified local cache.
"""

from __future__ import annotations

from fastdata.storage._location import Location, RemoteLocation, is_url, parse_location

__all__ = ["Location", "RemoteLocation", "is_url", "parse_location"]

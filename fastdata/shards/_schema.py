"""The manifest (``index.json``) and the schema of the fields stored in shards."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fastdata.errors import ShardFormatError

FORMAT_NAME = "fastdata-shards"
FORMAT_VERSION = 1
MANIFEST_NAME = "index.json"

FieldKind = Literal["array", "encoded"]


@dataclass(frozen=True)
class FieldSpec:
    """One field stored for every sample.

    Attributes:
        name: Field name, also the HDF5 dataset (``array``) or group (``encoded``) name.
        kind: ``"array"``: a fixed ``shape`` and ``dtype`` per sample, stored as one
            ``(N, *shape)`` dataset. ``"encoded"``: variable-length bytes per sample,
            stored as one flat ``uint8`` blob (``<name>/data``) plus ``int64`` offsets
            (``<name>/offsets``, ``N + 1`` entries).
        dtype: NumPy dtype name of an array field (``"uint8"``, ``"uint16"``, ``"int64"``);
            ``"uint8"`` for encoded fields (the bytes).
        shape: Per-sample shape of an array field, e.g. ``(224, 224, 3)``; ``()`` for scalars.
        layout: Axis names of the per-sample shape, e.g. ``"HWC"``, ``"HW"``, ``"DHW"``.
        encoding: For encoded fields: ``"jpeg"``, ``"png"`` or ``"utf-8"``.
    """

    name: str
    kind: FieldKind
    dtype: str
    shape: tuple[int, ...] = ()
    layout: str = ""
    encoding: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("array", "encoded"):
            raise ValueError(f"kind must be 'array' or 'encoded', got {self.kind!r}")
        if self.kind == "encoded" and self.encoding is None:
            raise ValueError(f"encoded field {self.name!r} needs an encoding")
        if self.layout and len(self.layout) != len(self.shape):
            raise ValueError(
                f"layout {self.layout!r} of field {self.name!r} does not match shape {self.shape}"
            )
        np.dtype(self.dtype)  # raises TypeError for an unknown dtype name

    @property
    def sample_nbytes(self) -> int:
        """Bytes per sample of an array field (0 for encoded fields, whose size varies)."""
        if self.kind == "encoded":
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FieldSpec:
        return cls(
            name=data["name"],
            kind=data["kind"],
            dtype=data["dtype"],
            shape=tuple(data.get("shape", ())),
            layout=data.get("layout", ""),
            encoding=data.get("encoding"),
        )


@dataclass(frozen=True)
class ShardInfo:
    """One shard file as the manifest records it."""

    file: str
    num_samples: int
    num_bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Manifest:
    """Everything ``index.json`` holds about a shard set.

    Attributes:
        fields: The stored fields, in order.
        shards: The shard files, in sample order.
        class_names: Label ``i`` is ``class_names[i]`` (empty when there are no labels).
        stats: Per field, per-channel statistics of the stored pixels:
            ``{"image": {"mean": [...], "std": [...], "count": n}}`` on the 0-255 scale.
        source: Description of the input (kind, path, number of inputs).
        options: The preprocessing options that produced the shards.
        skipped: Inputs left out, as ``{"path": ..., "reason": ...}``.
    """

    fields: list[FieldSpec]
    shards: list[ShardInfo]
    class_names: list[str] = field(default_factory=list)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    version: int = FORMAT_VERSION

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)

    def field(self, name: str) -> FieldSpec:
        """The spec of field ``name``; ``KeyError`` naming the stored fields otherwise."""
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(f"no field {name!r}; stored fields: {[f.name for f in self.fields]}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "fields": [f.to_json() for f in self.fields],
            "shards": [s.to_json() for s in self.shards],
            "class_names": self.class_names,
            "stats": self.stats,
            "source": self.source,
            "options": self.options,
            "skipped": self.skipped,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], path: str | Path) -> Manifest:
        if data.get("format") != FORMAT_NAME:
            raise ShardFormatError(f"not a {FORMAT_NAME} manifest", path)
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise ShardFormatError(
                f"manifest format version {version} is not supported "
                f"(this fastdata reads version {FORMAT_VERSION})",
                path,
            )
        try:
            return cls(
                fields=[FieldSpec.from_json(f) for f in data["fields"]],
                shards=[ShardInfo(**s) for s in data["shards"]],
                class_names=list(data.get("class_names", [])),
                stats=dict(data.get("stats", {})),
                source=dict(data.get("source", {})),
                options=dict(data.get("options", {})),
                skipped=list(data.get("skipped", [])),
                version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardFormatError(f"malformed manifest ({exc})", path) from exc


def manifest_path(root: str | Path) -> Path:
    """``root/index.json``, or ``root`` itself when it already names the manifest."""
    root = Path(root)
    return root if root.name == MANIFEST_NAME else root / MANIFEST_NAME


def load_manifest(root: str | Path) -> Manifest:
    """Read ``index.json`` of a shard set (``root`` is the folder or the manifest itself)."""
    path = manifest_path(root)
    if not path.is_file():
        raise ShardFormatError(
            "no shard manifest found (is this the OUT folder of `fastdata preprocess`?)", path
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"unreadable manifest ({exc})", path) from exc
    return Manifest.from_json(data, path)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` so that readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_manifest(root: str | Path, manifest: Manifest) -> Path:
    """Write ``index.json`` atomically; returns its path."""
    path = manifest_path(root)
    write_json_atomic(path, manifest.to_json())
    return path

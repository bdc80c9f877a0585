"""The manifest (``index.json``) and the schema of the fields stored in shards."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from fastdata._files import write_json_atomic
from fastdata._roles import check_role, default_role
from fastdata._storage import parse_location, read_file
from fastdata.errors import ShardFormatError
from fastdata.shards._field_kind import NUMERIC_KINDS, FieldKind
from fastdata.shards._kinds import kind_class

FORMAT_NAME = "fastdata-shards"
FORMAT_VERSION = 2
# Versions this fastdata reads: 1 had no field roles (they default, see default_role).
READABLE_VERSIONS = (1, 2)
MANIFEST_NAME = "index.json"
# Lossless compressions a shard's array fields may use (HDF5 filters that h5py always has).
COMPRESSIONS = ("gzip", "lzf")


@dataclass(frozen=True)
class FieldSpec:
    """One field stored for every sample.

    Attributes:
        name: Field name, also the HDF5 dataset (``array``) or group (``encoded``) name.
        kind: Name of the field's kind (:attr:`field_kind` is its class, bound to this
            spec). ``"array"``: a fixed ``shape`` and ``dtype`` per sample, stored as one
            ``(N, *shape)`` dataset. ``"encoded"``: variable-length bytes per sample,
            stored as one flat ``uint8`` blob (``<name>/data``) plus ``int64`` offsets
            (``<name>/offsets``, ``N + 1`` entries).
        dtype: NumPy dtype name of an array field (``"uint8"``, ``"uint16"``, ``"int64"``);
            ``"uint8"`` for encoded fields (the bytes).
        shape: Per-sample shape of an array field, e.g. ``(224, 224, 3)``; ``()`` for scalars.
        axes: Axis letters of the per-sample shape, e.g. ``"HWC"``, ``"HW"``, ``"DHW"``
            (the manifest key ``axes``; manifests written before it was named so say
            ``layout``, which is read the same).
        encoding: For encoded fields: ``"jpeg"``, ``"png"`` or ``"utf-8"``.
        role: What the field is, which decides how transforms move it: one of
            ``"image"``, ``"mask"``, ``"boxes"``, ``"label"``, ``"box_labels"``,
            ``"path"``, ``"other"`` (:data:`fastdata._roles.ROLES`). Left empty, the
            default for the field's name and kind (:func:`fastdata._roles.default_role`),
            which is also what manifests of format version 1 (written before roles) get.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...] = ()
    axes: str = ""
    encoding: str | None = None
    role: str = ""

    def __post_init__(self) -> None:
        np.dtype(self.dtype)  # raises TypeError for an unknown dtype name
        kind_class(self.kind).check(self)
        if self.role:
            check_role(self.role, f"role of field {self.name!r}")
        else:
            object.__setattr__(self, "role", default_role(self))

    @cached_property
    def field_kind(self) -> FieldKind:
        """What this field's kind does: size, write, view, gather, describe."""
        return kind_class(self.kind)(self)

    @property
    def sample_nbytes(self) -> int:
        """Bytes per sample (0 for kinds whose samples vary in size, such as encoded)."""
        return self.field_kind.sample_nbytes

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_json(cls, data: Any, key: str = "fields[0]") -> FieldSpec:
        """A spec from its manifest entry; ``ValueError`` naming ``key`` when malformed."""
        entry = _expect(data, dict, key)
        kind = _expect(entry.get("kind"), str, f"{key}.kind")
        try:
            kind_class(kind)
        except ValueError as exc:
            raise ValueError(f"{key}.{exc}") from exc
        dtype = _expect(entry.get("dtype"), str, f"{key}.dtype")
        try:
            parsed = np.dtype(dtype)
        except TypeError as exc:
            raise ValueError(f"{key}.dtype {dtype!r} is not a NumPy dtype") from exc
        if parsed.kind not in NUMERIC_KINDS or parsed.fields is not None or parsed.subdtype:
            raise ValueError(f"{key}.dtype must be a plain numeric dtype, got {dtype!r}")
        shape = _expect(entry.get("shape", []), list, f"{key}.shape")
        for axis, size in enumerate(shape):
            _count(size, f"{key}.shape[{axis}]")
        encoding = entry.get("encoding")
        if encoding is not None:
            _expect(encoding, str, f"{key}.encoding")
        name = _expect(entry.get("name"), str, f"{key}.name")
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{key}.name must be a non-empty name without '/', got {name!r}")
        axes_key = _axes_key(entry, key)
        axes = _expect(entry.get(axes_key, ""), str, f"{key}.{axes_key}")
        role = _expect(entry.get("role", ""), str, f"{key}.role")
        try:
            return cls(name, kind, dtype, tuple(shape), axes, encoding, role)
        except ValueError as exc:  # the kind's own rules
            raise ValueError(f"{key}: {exc}") from exc


@dataclass(frozen=True)
class ShardInfo:
    """One shard file as the manifest records it.

    Attributes:
        file: File name inside the shard set's folder (never a path).
        num_samples: Samples in the shard.
        num_bytes: Size of the file.
        sha256: Hex SHA-256 of the whole file.
        job: Identity of the job that wrote the set (``""`` when not recorded); the shard
            file holds the same value in its ``job`` attribute.
        inputs: Digest of the inputs this shard was made from (sizes and modification
            times; ``""`` when not recorded), also in the file's ``inputs`` attribute.
    """

    file: str
    num_samples: int
    num_bytes: int
    sha256: str
    job: str = ""
    inputs: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("job", "inputs"):
            if not out[key]:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: Any, key: str = "shards[0]") -> ShardInfo:
        """An entry from its manifest JSON; ``ValueError`` naming ``key`` when malformed."""
        entry = _expect(data, dict, key)
        file = _expect(entry.get("file"), str, f"{key}.file")
        if not is_plain_name(file):
            raise ValueError(
                f"{key}.file must be a plain file name inside the shard folder, got {file!r}"
            )
        sha256 = _expect(entry.get("sha256"), str, f"{key}.sha256")
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"{key}.sha256 must be 64 lowercase hex digits, got {sha256!r}")
        return cls(
            file=file,
            num_samples=_count(entry.get("num_samples"), f"{key}.num_samples"),
            num_bytes=_count(entry.get("num_bytes"), f"{key}.num_bytes"),
            sha256=sha256,
            job=_expect(entry.get("job", ""), str, f"{key}.job"),
            inputs=_expect(entry.get("inputs", ""), str, f"{key}.inputs"),
        )


def is_plain_name(name: str) -> bool:
    """True for a file name that stays inside its folder: no separator, not ``.``/``..``."""
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


# What a field's ``axes`` was called in manifests written before the name changed.
_FORMER_AXES_KEY = "layout"


def _axes_key(entry: dict[str, Any], key: str) -> str:
    """The key of a field entry that holds its axes: ``axes``, or ``layout`` in a manifest
    written before; both at once is malformed (which one is meant?)."""
    if _FORMER_AXES_KEY not in entry:
        return "axes"
    if "axes" in entry:
        raise ValueError(f"{key} has both axes and its former name {_FORMER_AXES_KEY}: keep axes")
    return _FORMER_AXES_KEY


def _expect(value: Any, kind: type, key: str) -> Any:
    """``value`` when it is a ``kind`` (a JSON type); ``ValueError`` naming ``key`` else."""
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        names = {dict: "an object", list: "a list", str: "a string", int: "an integer"}
        raise ValueError(
            f"{key} must be {names.get(kind, kind.__name__)}, got {type(value).__name__} "
            f"{value!r:.60}"
        )
    return value


def _count(value: Any, key: str) -> int:
    """A non-negative JSON integer; ``ValueError`` naming ``key`` else."""
    if _expect(value, int, key) < 0:
        raise ValueError(f"{key} must be >= 0, got {value}")
    return int(value)


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
            "version": FORMAT_VERSION,  # roles are filled in whatever version was read
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
    def from_json(cls, data: Any, path: str | Path) -> Manifest:
        """Parse and check a manifest.

        Raises:
            ShardFormatError: Not a manifest of a version this fastdata reads, or malformed:
                a key of the wrong type or value (the message names it), a shard ``file``
                that is not a plain name inside the folder, a shard listed twice, a field
                listed twice, or totals that disagree with the shard entries.
        """
        if not isinstance(data, dict):
            raise ShardFormatError(
                f"malformed manifest (a JSON object expected, got {type(data).__name__})", path
            )
        if data.get("format") != FORMAT_NAME:
            raise ShardFormatError(f"not a {FORMAT_NAME} manifest", path)
        version = data.get("version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise ShardFormatError(
                f"manifest format version {version} is not supported "
                f"(this fastdata reads versions {', '.join(map(str, READABLE_VERSIONS))})",
                path,
            )
        try:
            manifest = cls(
                fields=[
                    FieldSpec.from_json(f, f"fields[{i}]")
                    for i, f in enumerate(_expect(data.get("fields"), list, "fields"))
                ],
                shards=[
                    ShardInfo.from_json(s, f"shards[{i}]")
                    for i, s in enumerate(_expect(data.get("shards"), list, "shards"))
                ],
                class_names=list(_expect(data.get("class_names", []), list, "class_names")),
                stats=dict(_expect(data.get("stats", {}), dict, "stats")),
                source=dict(_expect(data.get("source", {}), dict, "source")),
                options=dict(_expect(data.get("options", {}), dict, "options")),
                skipped=list(_expect(data.get("skipped", []), list, "skipped")),
                version=version,
            )
            manifest.check()
            for key in ("num_samples", "num_bytes"):
                if key in data and _count(data[key], key) != getattr(manifest, key):
                    raise ValueError(
                        f"{key} is {data[key]} but the shard entries add up to "
                        f"{getattr(manifest, key)}"
                    )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardFormatError(f"malformed manifest ({exc})", path) from exc
        return manifest

    def check(self) -> None:
        """``ValueError`` when a field or a shard file is listed twice, or no field at all."""
        if not self.fields:
            raise ValueError("fields must list at least one field")
        for what, names in (
            ("fields", [f.name for f in self.fields]),
            ("shards", [s.file for s in self.shards]),
        ):
            seen: set[str] = set()
            for i, name in enumerate(names):
                if name in seen:
                    key = "name" if what == "fields" else "file"
                    raise ValueError(f"{what}[{i}].{key} {name!r} is listed twice")
                seen.add(name)


def manifest_path(root: str | Path) -> Path:
    """``root/index.json``, or ``root`` itself when it already names the manifest."""
    root = Path(root)
    return root if root.name == MANIFEST_NAME else root / MANIFEST_NAME


def load_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Read ``index.json`` of a shard set (``root`` is the folder or the manifest itself)."""
    location = parse_location(root, "path")
    if isinstance(location, Path):
        path = manifest_path(location)
        if not path.is_file():
            raise ShardFormatError(
                "no shard manifest found (is this the OUT folder of `fastdata preprocess`?)", path
            )
        where: str | Path = path
        reading = path.read_bytes
    else:
        where = location.child(MANIFEST_NAME)

        def reading() -> bytes:
            try:
                return read_file(location, MANIFEST_NAME)[0]
            except FileNotFoundError as exc:
                raise ShardFormatError(
                    "no shard manifest found (is this the OUT of `fastdata preprocess`?)", where
                ) from exc

    try:
        data = json.loads(reading())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"unreadable manifest ({exc})", where) from exc
    return Manifest.from_json(data, where)


def save_manifest(root: str | Path, manifest: Manifest) -> Path:
    """Write ``index.json`` atomically; returns its path."""
    path = manifest_path(root)
    write_json_atomic(path, manifest.to_json())
    return path

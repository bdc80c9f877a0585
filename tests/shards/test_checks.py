"""Readers and `verify` check the manifest and every shard they open against each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from fastdata._file_hash import file_sha256
from fastdata._storage import HeldShard
from fastdata.cli import main
from fastdata.errors import ShardFormatError
from fastdata.shards import (
    FieldSpec,
    Manifest,
    ShardReader,
    ShardWriter,
    load_manifest,
    save_manifest,
    verify_shards,
)
from fastdata.shards.reader import OpenShard, open_shard
from tests.conftest import write_image_shards

FIELDS = [
    FieldSpec("image", "array", "uint8", (4, 4, 3), "HWC"),
    FieldSpec("label", "array", "int64"),
    FieldSpec("jpeg", "encoded", "uint8", encoding="jpeg"),
]


def _write_set(root: Path, counts: tuple[int, ...] = (3, 4), job: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    start = 0
    for number, count in enumerate(counts):
        with ShardWriter(
            root / f"shard-{number:05d}.h5", FIELDS, job=job, inputs=f"in{number}"
        ) as w:
            for i in range(start, start + count):
                image = np.full((4, 4, 3), i, np.uint8)
                w.append({"image": image, "label": i, "jpeg": bytes([i]) * (i + 1)})
            shards.append(w.close())
        start += count
    save_manifest(root, Manifest(fields=FIELDS, shards=shards))
    return root


def _edit_manifest(root: Path, edit: Any) -> None:
    path = root / "index.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _rehash(root: Path, data: dict[str, Any]) -> None:
    """Record the current size and checksum of every shard (as an attacker would)."""
    for entry in data["shards"]:
        path = root / entry["file"]
        entry["num_bytes"] = path.stat().st_size
        entry["sha256"] = file_sha256(path)
    data["num_bytes"] = sum(entry["num_bytes"] for entry in data["shards"])


def _replace_dataset(path: Path, name: str, data: Any, dtype: Any = None) -> None:
    """Rewrite dataset ``name`` of a shard file with ``data`` (contiguous, same name)."""
    with h5py.File(path, "r+") as h5:
        del h5[name]
        h5.create_dataset(name, data=data, dtype=dtype)


# -- item 9: dtype, shape and storage are checked before anything is mapped ---------------
def test_vlen_string_dataset_is_refused_not_mapped(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    strings = np.array([b"x" * 48] * 3, dtype=object)
    _replace_dataset(root / "shard-00000.h5", "image", strings, h5py.string_dtype())
    _edit_manifest(root, lambda d: _rehash(root, d))
    reader = ShardReader(root)
    with pytest.raises(ShardFormatError, match=r"/image has dtype object.*manifest records uint8"):
        reader.read_batch("image", [0, 1])
    problems = verify_shards(root, show_progress=False)
    assert [p.file for p in problems] == ["shard-00000.h5"]
    assert "dtype object" in problems[0].reason


def test_wrong_dtype_and_shape_in_file_are_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    _replace_dataset(root / "shard-00000.h5", "image", np.zeros((3, 4, 4, 3), np.uint16))
    _replace_dataset(root / "shard-00001.h5", "image", np.zeros((4, 4, 3, 4), np.uint8))
    _edit_manifest(root, lambda d: _rehash(root, d))
    reader = ShardReader(root)
    with pytest.raises(ShardFormatError, match="dtype uint16, the manifest records uint8"):
        reader.read("image", 0)
    with pytest.raises(ShardFormatError, match=r"shape \(4, 4, 3, 4\).*\(4, 4, 4, 3\)"):
        reader.read("image", 5)
    assert len(verify_shards(root, show_progress=False)) == 2


def test_dataset_stored_outside_the_file_is_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(range(256)) * 4)
    with h5py.File(root / "shard-00000.h5", "r+") as h5:
        del h5["label"]
        h5.create_dataset("label", shape=(3,), dtype="int64", external=[(str(outside), 0, 24)])
    _edit_manifest(root, lambda d: _rehash(root, d))
    with pytest.raises(ShardFormatError, match="outside the shard file"):
        ShardReader(root).read("label", 0)


def test_encoded_offsets_past_the_data_are_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    with h5py.File(root / "shard-00000.h5", "r+") as h5:
        h5["jpeg/offsets"][-1] = 10_000
    _edit_manifest(root, lambda d: _rehash(root, d))
    with pytest.raises(ShardFormatError, match="offsets of field 'jpeg'"):
        ShardReader(root).read("jpeg", 2)


# -- item 14: the manifest must agree with the files ---------------------------------------
@pytest.mark.parametrize("count", [2, 5])
def test_lowered_or_raised_count_is_refused(tmp_path: Path, count: int) -> None:
    root = _write_set(tmp_path / "s")

    def edit(data: dict[str, Any]) -> None:
        data["shards"][0]["num_samples"] = count
        data["num_samples"] = count + 4

    _edit_manifest(root, edit)
    reader = ShardReader(root)
    with pytest.raises(ShardFormatError, match=f"holds 3 samples, the manifest records {count}"):
        reader.read_batch("image", [0])
    problems = verify_shards(root, show_progress=False)
    assert len(problems) == 1 and "holds 3 samples" in problems[0].reason


def test_changed_dtype_in_manifest_is_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    _edit_manifest(root, lambda d: d["fields"][0].update(dtype="uint16", shape=[4, 4, 3]))
    with pytest.raises(ShardFormatError, match="dtype uint8, the manifest records uint16"):
        ShardReader(root).read("image", 0)
    assert len(verify_shards(root, show_progress=False)) == 2


def test_swapped_field_kind_is_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    _edit_manifest(root, lambda d: d["fields"][2].update(kind="array"))
    with pytest.raises(ShardFormatError, match="/jpeg is missing or not a dataset"):
        ShardReader(root).read("label", 0)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["shards"].append(dict(d["shards"][0])), r"shards\[2\].file .* listed twice"),
        (lambda d: d["shards"][0].update(num_samples=-1), r"shards\[0\].num_samples must be >= 0"),
        (lambda d: d.update(num_samples=99), "num_samples is 99 but the shard entries add up to 7"),
        (lambda d: d["fields"].append(d["fields"][1]), r"fields\[3\].name 'label' is listed twice"),
    ],
)
def test_inconsistent_manifest_is_refused(tmp_path: Path, edit: Any, message: str) -> None:
    root = _write_set(tmp_path / "s")
    _edit_manifest(root, edit)
    for open_it in (ShardReader, lambda r: verify_shards(r, show_progress=False)):
        with pytest.raises(ShardFormatError, match=message):
            open_it(root)


# -- item 15: shard entries are plain names inside the folder ------------------------------
@pytest.mark.parametrize("name", ["../elsewhere/x.h5", "/etc/passwd", "sub/shard.h5", ".."])
def test_shard_file_outside_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    root = _write_set(tmp_path / "s")
    (tmp_path / "elsewhere").mkdir()
    (root / "shard-00000.h5").rename(tmp_path / "elsewhere" / "x.h5")
    _edit_manifest(root, lambda d: d["shards"][0].update(file=name))
    for open_it in (ShardReader, lambda r: verify_shards(r, show_progress=False)):
        with pytest.raises(ShardFormatError, match=r"shards\[0\].file must be a plain file name"):
            open_it(root)


# -- item 16: malformed manifests name the key ---------------------------------------------
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["shards"][0].update(num_samples="3"),
            r"shards\[0\].num_samples must be an int",
        ),
        (lambda d: d["shards"][1].update(num_bytes=True), r"shards\[1\].num_bytes must be an int"),
        (
            lambda d: d["fields"][0].update(kind="encoded"),
            r"fields\[0\]: encoded field 'image' must have shape \(\)",
        ),
        (
            lambda d: d["fields"][0].update(kind="blob"),
            r"fields\[0\].kind must be one of 'array', 'encoded', 'ragged', 'ragged_image', "
            r"got 'blob'",
        ),
        (lambda d: d["fields"][0].update(dtype="object"), r"fields\[0\].dtype must be a plain"),
        (lambda d: d["fields"][0].update(dtype="nope"), r"fields\[0\].dtype 'nope' is not"),
        (lambda d: d["fields"][0].update(shape="4x4"), r"fields\[0\].shape must be a list"),
        (lambda d: d["fields"][0].update(shape=[4, -4, 3]), r"fields\[0\].shape\[1\] must be >= 0"),
        (lambda d: d.update(shards={"file": "x"}), "shards must be a list"),
        (lambda d: d["shards"].__setitem__(0, "shard-00000.h5"), r"shards\[0\] must be an object"),
        (lambda d: d["shards"][0].pop("sha256"), r"shards\[0\].sha256 must be a string"),
        (lambda d: d.update(class_names="abc"), "class_names must be a list"),
        (lambda d: d["fields"][0].update(axes=3), r"fields\[0\].axes must be a str"),
        (lambda d: d["fields"][0].update(axes="HW"), r"fields\[0\]: axes 'HW' of field 'image'"),
        (
            lambda d: d["fields"][0].update(layout="HWC"),
            r"fields\[0\] has both axes and its former name layout: keep axes",
        ),
    ],
)
def test_malformed_manifest_names_the_key(tmp_path: Path, edit: Any, message: str) -> None:
    root = _write_set(tmp_path / "s")
    _edit_manifest(root, edit)
    with pytest.raises(ShardFormatError, match=f"malformed manifest \\({message}"):
        load_manifest(root)


def test_axes_are_written_as_axes_and_read_under_their_former_key(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    written = json.loads((root / "index.json").read_text())["fields"][0]
    assert written["axes"] == "HWC" and "layout" not in written
    with h5py.File(root / "shard-00000.h5") as h5:
        assert h5["image"].attrs["axes"] == "HWC" and "layout" not in h5["image"].attrs
    # a manifest of an earlier version: the field entries say "layout"
    _edit_manifest(root, lambda d: [f.update(layout=f.pop("axes")) for f in d["fields"]])
    assert load_manifest(root).fields == FIELDS
    assert ShardReader(root).read_batch("image", [2]).shape == (1, 4, 4, 3)


def test_manifest_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text("[1, 2]")
    with pytest.raises(ShardFormatError, match="a JSON object expected, got list"):
        ShardReader(tmp_path)


# -- item 12: not a regular file, or not the recorded size ---------------------------------
def test_fifo_in_place_of_a_shard_does_not_hang(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    (root / "shard-00001.h5").unlink()
    os.mkfifo(root / "shard-00001.h5")
    # In a child process: a reader blocked in open() holds the GIL and could not be
    # interrupted from a thread of this one.
    script = (
        "import sys\n"
        "from fastdata.errors import ShardFormatError\n"
        "from fastdata.shards import ShardReader\n"
        "try:\n"
        f"    ShardReader({str(root)!r}).read('image', 5)\n"
        "except ShardFormatError as exc:\n"
        "    print(exc)\n"
    )
    try:
        child = subprocess.run(
            [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("opening a FIFO shard hung")
    assert "shard is not a regular file" in child.stdout, child.stderr
    assert verify_shards(root, show_progress=False)[0].reason == "not a regular file"


def test_truncated_shard_is_an_error_at_open(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s")
    path = root / "shard-00001.h5"
    os.truncate(path, path.stat().st_size - 64)
    with pytest.raises(ShardFormatError, match=r"shard is \d+ bytes, the manifest records"):
        ShardReader(root).read_batch("image", [4, 5])


# -- item 3: a shard rewritten after the manifest was read ---------------------------------
def test_shard_rewritten_by_another_job_is_refused(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s", job="a" * 64)
    reader = ShardReader(root)  # the manifest is read now, the shards on first use
    reader.read("image", 0)
    other = _write_set(tmp_path / "t", job="b" * 64)
    os.replace(other / "shard-00001.h5", root / "shard-00001.h5")  # same size, other job
    with pytest.raises(ShardFormatError, match=r"job attribute .* rewritten after the manifest"):
        reader.read_batch("image", [0, 4])


def test_unchanged_shard_set_reads_in_every_mode(tmp_path: Path) -> None:
    root = _write_set(tmp_path / "s", job="a" * 64)
    for use_mmap in (True, False):
        reader = ShardReader(root, use_mmap=use_mmap)
        assert reader.read_batch("label", [6, 0]).tolist() == [6, 0]
        assert reader.read("jpeg", 6).tobytes() == b"\x06" * 7
    assert verify_shards(root, show_progress=False) == []
    assert load_manifest(root).shards[0].job == "a" * 64


# -- the `fastdata verify` command ----------------------------------------------------------
def test_verify_command_reports_structure_and_manifest_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _write_set(tmp_path / "s")
    assert main(["verify", "-q", str(root)]) == 0
    _replace_dataset(root / "shard-00001.h5", "label", np.zeros(4, np.float64))
    _edit_manifest(root, lambda d: _rehash(root, d))
    capsys.readouterr()
    assert main(["verify", "-q", str(root)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("CORRUPT shard-00001.h5: shard does not match the manifest: /label")
    _edit_manifest(root, lambda d: d["shards"][0].update(file="/etc/passwd"))
    assert main(["verify", "-q", str(root)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("fastdata verify: error: malformed manifest (shards[0].file must be")


@pytest.mark.parametrize("use_mmap", [True, False])
def test_a_shard_held_in_memory_is_read_by_hdf5_from_its_own_copy(
    tmp_path: Path, use_mmap: bool
) -> None:
    """A shard a full cache had no room for is opened from its bytes by HDF5's in-memory
    driver: no Python file object is called from HDF5's C code (DataLoader workers that
    closed shards opened on ``io.BytesIO`` crashed as they shut down)."""
    root = write_image_shards(tmp_path / "set", (5, 3))
    manifest = load_manifest(root)
    for info in manifest.shards:
        path = root / info.file
        held = HeldShard(path, data=path.read_bytes())
        in_memory = OpenShard(path, info, manifest.fields, use_mmap, held)
        on_disk = open_shard(path, info, manifest.fields, use_mmap=use_mmap)
        assert in_memory.h5.driver == "core"
        for field in ("image", "label"):
            assert np.array_equal(in_memory.views[field][:], on_disk.views[field][:])
        in_memory.close()
        on_disk.close()
        assert not in_memory.h5.id.valid

"""``preprocess`` of a source in object storage (an ImageFolder tree, a CSV list of paths
relative to it): the same shards as from the same local folder, each input read through
the storage seam by the worker that processes it; failures follow ``on_error``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import h5py
import numpy as np
import pytest

from fastdata import PreprocessOptions, ShardDataset
from fastdata._storage import _backend, parse_location
from fastdata._storage._backend import object_store
from fastdata.cli import main
from fastdata.errors import PreprocessError
from fastdata.preprocess import FileListSource, ImageFolderSource, preprocess
from fastdata.shards import ShardReader
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import upload_tree

pytest.importorskip("boto3")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """An ImageFolder of 14 JPEGs in two classes, one in a sub-folder, plus a hidden file
    and a file beside the class folders (recorded as skipped)."""
    rng = np.random.default_rng(0)
    root = tmp_path / "photos"
    for index in range(14):
        folder = root / f"class{index % 2}" / ("deep" if index == 5 else "")
        folder.mkdir(parents=True, exist_ok=True)
        size = (20 + index, 30, 3)
        cv2.imwrite(str(folder / f"{index:02d}.jpg"), rng.integers(0, 256, size, dtype=np.uint8))
    (root / "class0" / ".hidden.jpg").write_bytes(b"not listed")
    (root / "stray.jpg").write_bytes((root / "class0" / "00.jpg").read_bytes())
    return root


def _options(**kwargs: Any) -> PreprocessOptions:
    return PreprocessOptions(sizes=(16,), shard_bytes=3000, **kwargs)


def _manifest(folder: Path) -> dict[str, Any]:
    manifest = json.loads((folder / "index.json").read_text())
    for key in ("source", "created", "preprocess_seconds", "timings", "engine"):
        manifest.pop(key, None)
    for entry in manifest.get("skipped", []):
        entry["path"] = entry["path"].rsplit("/", 1)[-1]
    for shard in manifest["shards"]:  # the files differ in their "inputs" stamp (below)
        del shard["sha256"], shard["inputs"]
    return manifest


def _shard_contents(path: Path) -> dict[str, Any]:
    """Every attribute and dataset of a shard file but its ``inputs`` attribute (the
    inputs' stamps: size and modification time of a file, size and version of an object)."""
    found: dict[str, Any] = {f"/{k}": v for k, v in h5py.File(path).attrs.items()}
    found.pop("/inputs")

    def visit(name: str, node: Any) -> None:
        found.update({f"{name}/{k}": v for k, v in node.attrs.items()})
        if isinstance(node, h5py.Dataset):
            found[name] = node[()]

    with h5py.File(path) as file:
        file.visititems(visit)
    return found


def _same_sets(remote: Path, local: Path) -> None:
    assert _manifest(remote) == _manifest(local)
    got, expected = ShardDataset(remote), ShardDataset(local)
    assert len(got) == len(expected) > 0
    indices = list(range(len(got)))
    for a, b in zip(got.__getitems__(indices), expected.__getitems__(indices), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    names = sorted(p.name for p in remote.glob("shard-*.h5"))
    assert names == sorted(p.name for p in local.glob("shard-*.h5"))
    for name in names:
        got_shard, expected_shard = _shard_contents(remote / name), _shard_contents(local / name)
        assert got_shard.keys() == expected_shard.keys()
        for key, value in got_shard.items():
            assert np.array_equal(np.asarray(value), np.asarray(expected_shard[key])), key


def test_an_image_folder_in_object_storage_gives_the_shards_of_the_local_folder(
    photos: Path, bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    url = upload_tree(bucket, photos, "trees/photos")
    proxy.log.clear()
    remote = preprocess(url, tmp_path / "remote", _options(), workers=1, show_progress=False)
    local = preprocess(photos, tmp_path / "local", _options(), workers=1, show_progress=False)
    assert remote.num_samples == local.num_samples == 14
    _same_sets(tmp_path / "remote", tmp_path / "local")
    # one listing, then one GET per input: nothing downloaded but the inputs listed
    gets = [path for method, path in proxy.log if method == "GET" and "/trees/" in path]
    assert len(gets) == 14 and not any("hidden" in path or "stray" in path for path in gets)
    source = json.loads((tmp_path / "remote" / "index.json").read_text())["source"]
    assert source["path"] == url.rstrip("/") and source["kind"] == "imagefolder"


def test_a_list_in_object_storage_names_objects_relative_to_its_folder(
    photos: Path, bucket: str, tmp_path: Path
) -> None:
    rows = ["path,label", "class1/01.jpg,cat", "./class0/00.jpg,dog", "class1/03.jpg,cat"]
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    url = upload_tree(bucket, photos, "lists")
    options = _options()
    preprocess(FileListSource(f"{url}list.csv"), tmp_path / "remote", options,
               workers=1, show_progress=False)  # fmt: skip
    preprocess(photos / "list.csv", tmp_path / "local", options, workers=1, show_progress=False)
    _same_sets(tmp_path / "remote", tmp_path / "local")

    (photos / "outside.csv").write_text("path,label\n../other/a.jpg,1\n")
    upload_tree(bucket, photos, "lists")
    with pytest.raises(PreprocessError, match="outside the list's folder"):
        preprocess(f"{url}outside.csv", tmp_path / "out", options, show_progress=False)


def test_a_missing_or_refused_object_follows_on_error(
    photos: Path, bucket: str, tmp_path: Path, proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    rows = ["path,label", "class0/00.jpg,0", "class0/gone.jpg,0", "class1/01.jpg,1"]
    (photos / "list.csv").write_text("\n".join(rows) + "\n")
    url = upload_tree(bucket, photos, "faults")
    with pytest.raises(PreprocessError, match=r"gone\.jpg"):
        preprocess(f"{url}list.csv", tmp_path / "raise", _options(on_error="raise"), workers=1,
                   show_progress=False)  # fmt: skip
    summary = preprocess(f"{url}list.csv", tmp_path / "skip", _options(on_error="skip"),
                         workers=1, show_progress=False)  # fmt: skip
    assert summary.num_samples == 2
    skipped = json.loads((tmp_path / "skip" / "index.json").read_text())["skipped"]
    assert [entry["path"] for entry in skipped] == [f"{url}class0/gone.jpg"]

    # an object the store keeps refusing: the retries end, the sample follows on_error
    monkeypatch.setenv("FASTDATA_STORAGE_ATTEMPTS", "2")
    _backend._clients.clear()
    proxy.match = lambda method, path: method == "GET" and "01.jpg" in path
    proxy.plan, proxy.repeat = ["503"], True
    summary = preprocess(ImageFolderSource(url), tmp_path / "refused",
                         _options(on_error="skip"), workers=1, show_progress=False)  # fmt: skip
    assert summary.num_samples == 13
    skipped = json.loads((tmp_path / "refused" / "index.json").read_text())["skipped"]
    refused = [entry for entry in skipped if "01.jpg" in entry["path"]]
    assert len(refused) == 1 and "503" in refused[0]["reason"]


def test_the_cli_accepts_a_source_url(
    photos: Path, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = upload_tree(bucket, photos, "cli/photos")
    out = tmp_path / "out"
    argv = ["preprocess", url, str(out), "--size", "16", "--workers", "2", "-q"]
    assert main(argv) == 0
    assert len(ShardDataset(out)) == 14
    (photos / "list.tsv").write_text("label\tfile\n1\tclass1/01.jpg\n0\tclass0/00.jpg\n")
    list_url = upload_tree(bucket, photos, "cli/photos") + "list.tsv"
    columns = ["--path-column", "file", "--label-column", "0"]
    assert main(["preprocess", list_url, str(tmp_path / "list"), *columns, "-q"]) == 0
    reader = ShardReader(tmp_path / "list")
    assert [int(reader.read("label", i)) for i in range(2)] == [1, 0]
    capsys.readouterr()
    assert main(["preprocess", f"s3://{bucket}/nothing/", str(tmp_path / "none"), "-q"]) == 1
    # one line of fastdata's (the test server logs its requests there too)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fastdata")]
    assert err == [f"fastdata preprocess: error: source does not exist or is empty: "
                   f"s3://{bucket}/nothing/"]  # fmt: skip


def test_a_rerun_keeps_shards_whose_objects_are_unchanged_and_finds_a_replaced_one(
    photos: Path, bucket: str, tmp_path: Path
) -> None:
    url = upload_tree(bucket, photos, "rerun")
    out = tmp_path / "out"
    preprocess(url, out, _options(), workers=1, show_progress=False)

    def stamps() -> dict[str, tuple[int, int]]:
        return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*.h5")}

    before = stamps()
    preprocess(url, out, _options(), workers=1, show_progress=False)
    assert stamps() == before  # nothing changed: every shard kept
    # the last image replaced by another: its shard is stale, as a local edited file's is
    store = object_store(parse_location(url))  # type: ignore[arg-type]
    store.write_bytes("rerun/class1/deep/05.jpg", (photos / "class1" / "13.jpg").read_bytes())
    with pytest.raises(PreprocessError, match=f"inputs of {sorted(before)[-1]}"):
        preprocess(url, out, _options(), workers=1, show_progress=False)
    assert stamps() == before

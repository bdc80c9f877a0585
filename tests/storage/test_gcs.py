"""``gs://`` through google-cloud-storage, against a local GCS emulator (gcp-storage-emulator,
started on 127.0.0.1 by the tests): preprocess uploads, verify re-checks, datasets read the
same batches as the local set through the same cache; a missing bucket or object is one
line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from fastdata import PreprocessOptions, RAMDataset, ShardDataset
from fastdata._storage import RemoteLocation, _backend, parse_location
from fastdata._storage._backend import object_store
from fastdata.cli import main
from fastdata.errors import ShardFormatError, StorageError
from fastdata.preprocess import preprocess
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import write_set

emulator = pytest.importorskip("gcp_storage_emulator.server", reason="the test extra installs it")
pytest.importorskip("google.cloud.storage", reason="the [gcs] extra installs it")

_BUCKET = "fastdata-gcs-test"


@pytest.fixture(scope="module")
def gcs_server() -> Iterator[str]:
    """``http://host:port`` of an in-memory GCS emulator with one bucket."""
    server = emulator.create_server("127.0.0.1", 0, in_memory=True, default_bucket=_BUCKET)
    server._api.daemon = True  # its thread would keep a failed run alive
    server.start()
    host, port = server._api._httpd.server_address
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def gcs(gcs_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The bucket's name; the client reaches the emulator through its standard variable."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "default-cache"))
    monkeypatch.setenv("FASTDATA_STORAGE_ATTEMPTS", "2")
    _backend._clients.clear()
    return _BUCKET


def _upload(folder: Path, url: str) -> None:
    location = parse_location(url)
    assert isinstance(location, RemoteLocation)
    store = object_store(location)
    for path in sorted(folder.iterdir()):
        store.upload(path, location.key(path.name))


def test_a_set_in_gcs_reads_the_same_batches_as_on_disk(gcs: str, tmp_path: Path) -> None:
    local = write_set(tmp_path / "set", (8, 8, 8, 6))
    url = f"gs://{gcs}/sets/read/"
    _upload(local, url)
    largest = max(p.stat().st_size for p in local.glob("*.h5"))
    reference = ShardDataset(local)
    indices = [29, 0, 17, 8, 3, 25]
    for dataset in (
        ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=2 * largest),
        RAMDataset.from_shards(url, cache_dir=tmp_path / "cache-ram", show_progress=False),
    ):
        assert len(dataset) == 30
        for got, expected in zip(dataset.__getitems__(indices), reference.__getitems__(indices),
                                 strict=True):  # fmt: skip
            assert torch.equal(got, expected)
    assert len(list((tmp_path / "cache").glob("*.h5"))) <= 2


def test_preprocess_to_gcs_then_verify(
    gcs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    for index in range(8):
        folder = tmp_path / "photos" / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{index}.jpg"), rng.integers(0, 256, (20, 24, 3), np.uint8))
    url = f"gs://{gcs}/sets/written"
    argv = ["preprocess", str(tmp_path / "photos"), url, "--size", "16", "--shard-mb", "0.002"]
    assert main([*argv, "-q", "--workers", "1"]) == 0
    assert main(["verify", url, "-q"]) == 0
    assert "OK: " in capsys.readouterr().out
    local = tmp_path / "local"
    options = PreprocessOptions(sizes=(16,), shard_bytes=int(0.002 * 2**20))
    preprocess(tmp_path / "photos", local, options, workers=1, show_progress=False)
    remote, reference = ShardDataset(url, cache_dir=tmp_path / "cache"), ShardDataset(local)
    for got, expected in zip(remote.__getitems__(list(range(8))),
                             reference.__getitems__(list(range(8))), strict=True):  # fmt: skip
        assert torch.equal(got, expected)


def test_a_missing_bucket_or_set_is_one_line(gcs: str, tmp_path: Path) -> None:
    missing_bucket = r"^cannot read gs://no-such-bucket-x/.*: no such bucket$"
    with pytest.raises(StorageError, match=missing_bucket):
        ShardDataset("gs://no-such-bucket-x/set/", cache_dir=tmp_path / "cache")
    with pytest.raises(ShardFormatError, match=f"no shard manifest found .*: gs://{gcs}/absent/"):
        ShardDataset(f"gs://{gcs}/absent/", cache_dir=tmp_path / "cache")


def test_transient_faults_are_retried(gcs: str, gcs_server: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A 503 and a dropped connection on shard downloads (a fault proxy in front of the
    emulator): retried, and the batches are right."""
    local = write_set(tmp_path / "set", (8, 8))
    url = f"gs://{gcs}/sets/faults/"
    _upload(local, url)
    proxy = FaultProxy(gcs_server.removeprefix("http://"))
    try:
        proxy.plan = ["503", "drop"]
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        monkeypatch.setenv("FASTDATA_STORAGE_ATTEMPTS", "4")
        _backend._clients.clear()
        dataset = ShardDataset(url, cache_dir=tmp_path / "cache")
        indices = list(range(16))
        expected = ShardDataset(local).__getitems__(indices)
        for got, wanted in zip(dataset.__getitems__(indices), expected, strict=True):
            assert torch.equal(got, wanted)
        assert proxy.faults_sent == {"503": 1, "drop": 1}
    finally:
        proxy.close()

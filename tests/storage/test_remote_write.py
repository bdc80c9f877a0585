"""``fastdata preprocess SRC s3://...``: shards uploaded as they complete, the manifest
last, a rerun resumes; ``fastdata verify s3://...`` re-checks every object."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from fastdata import PreprocessOptions, ShardDataset
from fastdata.cli import main
from fastdata.preprocess import preprocess
from tests.storage._proxy import FaultProxy

boto3 = pytest.importorskip("boto3")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """An ImageFolder of 12 small JPEGs in two classes."""
    rng = np.random.default_rng(0)
    for index in range(12):
        folder = tmp_path / "photos" / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)
        cv2.imwrite(str(folder / f"{index}.jpg"), image)
    return tmp_path / "photos"


def _puts(proxy: FaultProxy) -> list[str]:
    return [path.rsplit("/", 1)[-1] for method, path in proxy.log if method == "PUT"]


def test_preprocess_uploads_shards_then_the_manifest_and_reruns_resume(
    photos: Path, bucket: str, tmp_path: Path, proxy: FaultProxy,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    url = f"s3://{bucket}/sets/photos/"
    argv = ["preprocess", str(photos), url, "--size", "16", "--shard-mb", "0.002", "-q"]
    assert main([*argv, "--workers", "1"]) == 0
    puts = _puts(proxy)
    assert puts[-1] == "index.json" and puts.count("index.json") == 1
    assert len(puts) > 3 and all(name.endswith(".h5") for name in puts[:-1])
    assert main(["verify", url, "-q"]) == 0
    assert "OK: " in capsys.readouterr().out

    local = tmp_path / "local"
    preprocess(photos, local, _options(), workers=1, show_progress=False)
    remote = ShardDataset(url, cache_dir=tmp_path / "cache")
    reference = ShardDataset(local)
    assert len(remote) == len(reference) == 12
    indices = list(range(12))[::-1]
    for got, expected in zip(remote.__getitems__(indices), reference.__getitems__(indices),
                             strict=True):  # fmt: skip
        assert torch.equal(got, expected)

    proxy.log.clear()
    assert main([*argv, "--workers", "1"]) == 0  # a rerun: every shard kept
    assert _puts(proxy) == ["index.json"]


def _options() -> PreprocessOptions:
    return PreprocessOptions(sizes=(16,), shard_bytes=int(0.002 * 2**20))


def test_verify_names_a_damaged_object(
    photos: Path, bucket: str, s3_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{bucket}/damaged"
    preprocess(photos, url, _options(), workers=1, show_progress=False)
    client = boto3.client("s3", endpoint_url=f"http://{s3_server}", region_name="us-east-1")
    key = "damaged/shard-00001.h5"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    client.delete_object(Bucket=bucket, Key="damaged/shard-00002.h5")
    assert main(["verify", url, "-q"]) == 1
    err = capsys.readouterr().err
    assert "CORRUPT shard-00001.h5: sha256" in err and "CORRUPT shard-00002.h5: missing" in err

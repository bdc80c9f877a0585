"""The object-storage guide's example and its ``fastdata`` lines run as written against a
local S3 server: its bucket is a fresh one on that server, its cache folder one under
``tmp_path``, and the process group its sampler reads (``torchrun`` and
``init_process_group``) one rank of one."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import torch.distributed as dist

from fastdata import ShardDataset
from fastdata.shards import load_manifest
from tests.storage.conftest import upload_folder, upload_tree, write_set
from tests.test_doc_commands import command_lines, run_line
from tests.test_docs import GUIDES, blocks

PAGE = GUIDES / "storage.md"


# the example's 4 workers, on a machine with fewer CPUs
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_the_guides_example_reads_a_set_from_the_store(bucket: str, tmp_path: Path) -> None:
    url = upload_folder(bucket, write_set(tmp_path / "local"), "set")
    code = blocks(PAGE, "python")[0]
    assert '"s3://bucket/set/"' in code and '"/scratch/fd-cache"' in code
    code = code.replace('"s3://bucket/set/"', repr(url))
    code = code.replace('"/scratch/fd-cache"', repr(str(tmp_path / "cache")))
    scope: dict[str, Any] = {}
    store = tmp_path / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        exec(compile(code, str(PAGE), "exec"), scope)
        images, labels = next(iter(scope["loader"]))
    finally:
        dist.destroy_process_group()
    assert images.shape == (38, 3, 16, 16) and images.dtype == torch.uint8
    assert sorted(labels.tolist()) == list(range(38))  # every sample of the set, once
    assert any((tmp_path / "cache").iterdir())  # shards went through the cache


def test_the_guides_command_lines_run_against_the_store(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample_tool: Any
) -> None:
    """The guide's ``fastdata`` lines, in order, on its ``photos/`` (an ImageFolder of 6 JPEGs
    with a ``train.csv`` beside the classes, local and uploaded), their bucket the fresh one on
    the local server."""
    lines = [line for line in command_lines(PAGE) if "s3://bucket/" in line]
    assert [shlex.split(line)[1] for line in lines] == [
        "preprocess", "verify", "preprocess", "preprocess",
    ]  # fmt: skip
    photos = tmp_path / "photos"
    sample_tool.make_sample_dataset(
        photos, 6, num_classes=2, seed=0, image_size=(32, 24), workers=1
    )
    rows = [p.relative_to(photos).as_posix() for p in sorted(photos.rglob("*.jpg"))]
    (photos / "train.csv").write_text(
        "file,label\n" + "".join(f"{r},{r.split('/')[0][-1]}\n" for r in rows)
    )
    upload_tree(bucket, photos, "photos")
    monkeypatch.chdir(tmp_path)
    for line in lines:
        run_line(line, {"s3://bucket/": f"s3://{bucket}/"})
    assert load_manifest(f"s3://{bucket}/set/").num_samples == 6
    assert len(ShardDataset(tmp_path / "out")) == 6  # train.csv lies beside the classes
    assert load_manifest(f"s3://{bucket}/listed/").num_samples == 6


def test_the_guides_source_example_preprocesses_from_the_store(bucket: str, tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    for index, name in enumerate(("cat", "dog")):
        (photos / name).mkdir(parents=True)
        image = np.full((20, 24, 3), 60 * index, np.uint8)
        cv2.imwrite(str(photos / name / "a.png"), image)
    (photos / "train.csv").write_text("file,label\ndog/a.png,1\ncat/a.png,0\n")
    url = upload_tree(bucket, photos, "photos")
    code = blocks(PAGE, "python")[1].replace('"s3://bucket/photos/', f'"{url}')
    code = code.replace('"out/"', repr(str(tmp_path / "out")))
    code = code.replace('"listed/"', repr(str(tmp_path / "listed")))
    exec(compile(code, str(PAGE), "exec"), {})
    assert len(ShardDataset(tmp_path / "out")) == 2  # train.csv lies beside the classes
    assert len(ShardDataset(tmp_path / "listed")) == 2

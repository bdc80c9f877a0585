"""The documentation site: every public package has an API reference page, and every
Python example of the quick start, the guides and the format page runs as written (on a
tiny sample dataset, on the CPU).

Names an example uses without defining (``image_paths``, ``jpeg_bytes_a``...) are given to
it. What only a cluster has is swapped for a local stand-in, named where it is done: the
scale-out guide's ``torch.distributed`` group (``nccl`` under ``torchrun``) is a one-process
gloo group, its Ray cluster at ``/shared`` a private local Ray instance over the sample
set. The object-storage guide's example runs against a local S3 server in
``tests/storage/test_guide.py``.

The site build itself (``mkdocs build --strict``: broken references, pages missing from
the nav, docstrings mkdocstrings cannot parse) runs in ``make test`` and ``make docs``.
"""

from __future__ import annotations

import pkgutil
import re
import shlex
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata
from fastdata.cli import main
from fastdata.datasets import ShardDataset, passthrough_collate
from tests.conftest import DEMO_IMAGES, make_demo_workdir
from tests.detection_sets import painted_photos, write_coco
from tests.preprocess.test_ray_engine import (  # noqa: F401
    _ray_folder,
    _ray_module,
    ray_instance,
)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"


def public_packages() -> list[str]:
    """``fastdata``'s public subpackages (the CLI is documented by ``--help``) and errors."""
    names = [
        info.name
        for info in pkgutil.iter_modules(fastdata.__path__)
        if info.ispkg and not info.name.startswith("_") and info.name != "cli"
    ]
    return [*sorted(names), "errors"]


def test_every_public_package_has_a_reference_page_in_the_nav() -> None:
    nav = MKDOCS_YML.read_text()
    packages = public_packages()
    assert {"datasets", "decode", "gpu", "preprocess", "shards", "transforms", "tune"} <= set(
        packages
    )
    for name in packages:
        page = DOCS / "reference" / f"{name}.md"
        assert page.is_file(), f"no API reference page {page.relative_to(ROOT)} for {name}"
        assert re.search(rf"^::: fastdata\.{name}$", page.read_text(), flags=re.MULTILINE), page
        assert f"reference/{name}.md" in nav, f"{page.relative_to(ROOT)} is not in mkdocs.yml"
    assert "reference/fastdata.md" in nav


def test_the_top_level_reference_page_lists_every_public_name() -> None:
    page = (DOCS / "reference" / "fastdata.md").read_text()
    missing = [name for name in fastdata.__all__ if f"`{name}`" not in page]
    assert not missing, f"docs/reference/fastdata.md does not list {missing}"


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.DOTALL)


def test_quick_start_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample_tool: Any
) -> None:
    page = DOCS / "quickstart.md"
    commands = [
        shlex.split(line.split("#", 1)[0])
        for block in blocks(page, "bash")
        for line in block.splitlines()
        if line.startswith("fastdata ")
    ]
    preprocess_args = next(args for args in commands if args[1] == "preprocess")
    assert preprocess_args[2:4] == ["demo-data/sample", "out/"]
    # The sample set the page makes with tools/make_sample_dataset.py, smaller.
    sample_tool.make_sample_dataset(
        tmp_path / "demo-data" / "sample", 64, num_classes=3, seed=0, image_size=(64, 48)
    )
    monkeypatch.chdir(tmp_path)
    assert main([*preprocess_args[1:], "--workers", "1"]) == 0
    inspect_args = next(args for args in commands if args[1] == "inspect")
    assert main(inspect_args[1:]) == 0

    (code,) = blocks(page, "python")
    scope: dict[str, Any] = {}
    exec(compile(code, str(page), "exec"), scope)
    images, labels = scope["images"], scope["labels"]
    assert images.shape == (64, 3, 224, 224) and images.dtype == torch.bfloat16
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.shape == (64,) and labels.dtype == torch.int64
    # Normalized with the set's own statistics: about zero mean, unit spread.
    assert abs(images.float().mean().item()) < 0.2
    assert 0.7 < images.float().std().item() < 1.3


def run(page: Path, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a page's Python blocks in order, in one namespace (as ``__main__``)."""
    scope: dict[str, Any] = {"__name__": "__main__", **(namespace or {})}
    for code in blocks(page, "python"):
        exec(compile(code, str(page), "exec"), scope)
    return scope


GUIDES = DOCS / "guides"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sample_tool: Any) -> Path:
    """The demo folder, its ``out/`` written by the preprocessing guide's own example."""
    root = tmp_path_factory.mktemp("guides")
    return make_demo_workdir(root, sample_tool, lambda: run(GUIDES / "preprocess.md")["summary"])


def test_datasets_guide(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    paths = sorted(str(p) for p in (workdir / "demo-data" / "sample").rglob("*.jpg"))
    rng = np.random.default_rng(0)
    scope = run(
        GUIDES / "datasets.md",
        {
            "image_paths": paths,
            "targets": [i % 3 for i in range(len(paths))],
            "images_nhwc": rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8),
            "array_labels": np.arange(8),
            "masks_nhw": rng.integers(0, 5, (8, 32, 32), dtype=np.uint8),
        },
    )
    assert scope["images"].shape == (64, 3, 224, 224) and scope["images"].dtype == torch.uint8
    assert scope["labels"].shape == (64,) and scope["labels"].dtype == torch.int64
    assert len(scope["cached"]) == len(scope["pixels"]) == DEMO_IMAGES
    assert len(scope["arrays"]) == 8
    assert scope["on_disk"].options == scope["in_ram"].options == scope["read"]
    assert scope["in_ram"].__getitems__([0])[0].shape[-1] == 3  # HWC
    jpeg_images, _ = next(iter(scope["loader"]))
    assert jpeg_images.shape == (64, 3, 224, 224)
    assert scope["det_images"].shape == (16, 3, 512, 512)
    assert [tuple(b.shape) for b in scope["det_boxes"]] == [(1, 4)] * 16
    assert all(label.tolist() == [1] for label in scope["det_labels"])


def test_gpu_guide() -> None:
    scope = run(GUIDES / "gpu.md")
    assert scope["x"].shape == (16, 3, 24, 24) and scope["x"].dtype == torch.bfloat16


def test_decode_guide(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    encoded = ShardDataset("out-jpeg/", decode=False)
    jpegs = [encoded[i][0].numpy().tobytes() for i in range(3)]
    loader = DataLoader(encoded, batch_size=8, collate_fn=passthrough_collate)
    scope = run(
        GUIDES / "decode.md",
        {"jpeg_bytes_a": jpegs[0], "jpeg_bytes_b": jpegs[1], "list_of_encoded": jpegs,
         "loader": loader},
    )  # fmt: skip
    assert scope["images"].shape == (8, 3, 224, 224)  # the last batch the loop saw
    assert scope["train_images"].shape == (64, 3, 224, 224)  # through the dataset's decode=
    assert scope["train_labels"].shape == (64,)
    assert scope["decoded"].kept.tolist() == [0, 1, 2]


def test_tune_guide(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    page = GUIDES / "tune.md"
    assert "time_budget_s=30" in page.read_text()
    shorter = workdir / "tune.md"  # the same page with a 5 s search
    shorter.write_text(page.read_text().replace("time_budget_s=30", "time_budget_s=5"))
    scope = run(shorter)
    assert scope["result"].loader_kwargs["batch_size"] == 64
    assert scope["report"].verdict


def test_augment_guide(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    paths = sorted(str(p) for p in (workdir / "demo-data" / "sample").rglob("*.jpg"))
    scope = run(
        GUIDES / "augment.md", {"paths": paths, "labels": [i % 3 for i in range(len(paths))]}
    )
    assert scope["images"].shape == (64, 3, 224, 224) and scope["images"].dtype == torch.uint8
    assert scope["soft_labels"].shape == (64, 1000)
    assert scope["batch"].shape == (16, 3, 64, 64) and scope["soft"].shape == (16, 1000)
    assert scope["model_input"].dtype == torch.float32 and scope["mixed_soft"].shape == (16, 1000)
    assert scope["cropped"].shape == (2, 96, 96, 3) and len(scope["moved"]["boxes"]) == 2
    assert scope["on_device"]["image"].shape == (2, 3, 96, 96)
    assert scope["padded_boxes"].shape == (2, 1, 4) and scope["counts"][1] == 0


# Every page with Python examples, and the test here that runs them all.
RUN_BY = {
    "quickstart.md": "test_quick_start_runs_as_written",
    "FORMAT.md": "test_format_page",
    "guides/preprocess.md": "workdir",  # the fixture every guide test uses runs it
    "guides/datasets.md": "test_datasets_guide",
    "guides/gpu.md": "test_gpu_guide",
    "guides/decode.md": "test_decode_guide",
    "guides/tune.md": "test_tune_guide",
    "guides/augment.md": "test_augment_guide",
    "guides/distributed.md": "test_distributed_guide_ddp_loop and test_distributed_guide_ray",
    "guides/storage.md": "tests/storage/test_guide.py",
    "guides/detection.md": "test_detection_guide",
}


def test_every_page_with_python_examples_is_run() -> None:
    pages = {
        str(page.relative_to(DOCS))
        for page in DOCS.rglob("*.md")
        if "_ext" not in page.parts and blocks(page, "python")
    }
    assert pages == set(RUN_BY), f"pages with examples but no test: {pages - set(RUN_BY)}"


def test_format_page(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    scope = run(DOCS / "FORMAT.md")
    assert scope["image"].shape == (224, 224, 3) and scope["batch"].shape == (2, 224, 224, 3)
    assert scope["jpeg"].ndim == 1 and bytes(scope["jpeg"][:2]) == b"\xff\xd8"  # a JPEG


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_distributed_guide_ddp_loop(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DDP loop as one rank of one: gloo for nccl (no GPU here), the rendezvous that
    torchrun would set in the environment, and no worker processes."""
    import torch.distributed as dist  # noqa: PLC0415

    monkeypatch.chdir(workdir)
    for name, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }.items():
        monkeypatch.setenv(name, value)
    (code,) = [block for block in blocks(GUIDES / "distributed.md", "python") if "nccl" in block]
    code = code.replace('init_process_group("nccl")', 'init_process_group("gloo")')
    code = code.replace("num_workers=8", "num_workers=0")
    try:
        scope: dict[str, Any] = {"resuming": False, "checkpoint": {}, "epochs": 2}
        exec(compile(code, str(GUIDES / "distributed.md"), "exec"), scope)
        assert scope["images"].shape[1:] == (3, 224, 224)
        state = scope["checkpoint"]["loader"]  # saved at step 0 of the last epoch
        resumed = scope["train"].loader(batch_size=256, sampler=scope["sampler"])
        scope.update(resuming=True, checkpoint={"loader": state})
        resumed.load_state_dict(state)
        assert len(list(resumed)) == 1  # the batch after the checkpoint, of 2 in the epoch
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.ray
def test_distributed_guide_ray(
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    ray_instance: Any,  # noqa: F811
) -> None:
    """The Ray example on this machine's private Ray instance, over the sample set."""
    monkeypatch.chdir(workdir)
    (code,) = [b for b in blocks(GUIDES / "distributed.md", "python") if "RayEngine" in b]
    code = code.replace('"/shared/imagenet"', '"demo-data/sample"')
    code = code.replace('"/shared/out"', '"out-ray-guide/"')
    exec(compile(code, str(GUIDES / "distributed.md"), "exec"), {"__name__": "__main__"})
    assert len(ShardDataset("out-ray-guide/")) == DEMO_IMAGES


def test_detection_guide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    photos = painted_photos(tmp_path / "coco" / "images", num_images=8)
    write_coco(photos, tmp_path / "coco" / "instances_train.json")
    monkeypatch.chdir(tmp_path)
    scope = run(GUIDES / "detection.md")
    assert scope["summary"].num_samples == 8 and scope["summary"].num_skipped == 0
    images, boxes, labels = scope["images"], scope["boxes"], scope["labels"]
    assert images.shape == (4, 3, 96, 96) and images.dtype == torch.uint8
    assert [len(b) for b in boxes] == [len(c) for c in labels]
    assert all(b.dtype == torch.float32 and b.shape[1:] == (4,) for b in boxes)
    assert all(c.dtype == torch.int64 for c in labels)
    # the Faster R-CNN sketch is not run (torchvision): it is a ```py block
    assert "fasterrcnn_resnet50_fpn_v2" not in "".join(blocks(GUIDES / "detection.md", "python"))

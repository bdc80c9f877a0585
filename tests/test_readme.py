"""The README's Python examples run as written (on a tiny sample dataset, on the CPU).

Each example is found by a line it contains, so reordering the README does not break the
test; names an example uses without defining (``image_paths``, ``jpeg_bytes_a``...) are
given to it. Left out: the Ray example (a cluster at ``/shared``) and the DDP sketch
(``torch.distributed`` set up by ``torchrun``); tests/preprocess and tests/datasets cover
both APIs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import ShardDataset, passthrough_collate
from tests.conftest import DEMO_IMAGES, make_demo_workdir

README = Path(__file__).resolve().parents[1] / "README.md"


def example(marker: str) -> str:
    """The README's ```python block that contains ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"{len(found)} README examples contain {marker!r}"
    return found[0]


def run(code: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    scope = dict(namespace or {})
    exec(compile(code, str(README), "exec"), scope)
    return scope


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sample_tool: Any) -> Path:
    """The demo folder, its ``out/`` written by the README's own preprocessing example,
    run as the README shows it: a script's guarded main block."""
    code = example('summary = preprocess("demo-data/sample"')
    return make_demo_workdir(
        tmp_path_factory.mktemp("readme"),
        sample_tool,
        lambda: run(code, {"__name__": "__main__"})["summary"],
    )


def test_dataset_examples(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    paths = sorted(str(p) for p in (workdir / "demo-data" / "sample").rglob("*.jpg"))
    rng = np.random.default_rng(0)
    scope = run(
        example('train = ShardDataset("out/", fields'),
        {
            "image_paths": paths,
            "targets": [i % 3 for i in range(len(paths))],
            "images_nhwc": rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8),
            "array_labels": np.arange(8),
            "masks_nhw": rng.integers(0, 5, (8, 32, 32), dtype=np.uint8),
        },
    )
    assert scope["images"].shape == (64, 3, 224, 224) and scope["images"].dtype == torch.uint8
    assert scope["labels"].dtype == torch.int64
    assert len(scope["cached"]) == len(scope["pixels"]) == DEMO_IMAGES
    assert len(scope["arrays"]) == 8


def test_device_example() -> None:
    scope = run(example("from fastdata.gpu import"))
    assert scope["x"].shape == (16, 3, 24, 24) and scope["x"].dtype == torch.bfloat16


def test_decode_example(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    encoded = ShardDataset("out-jpeg/", decode=False)
    jpegs = [encoded[i][0].numpy().tobytes() for i in range(3)]
    loader = DataLoader(encoded, batch_size=8, collate_fn=passthrough_collate)
    scope = run(
        example("create_decoder("),
        {"jpeg_bytes_a": jpegs[0], "jpeg_bytes_b": jpegs[1], "list_of_encoded": jpegs,
         "loader": loader},
    )  # fmt: skip
    assert scope["images"].shape == (8, 3, 224, 224)  # the last batch the loop saw
    assert scope["decoded"].kept.tolist() == [0, 1, 2]


# The example profiles steps=50; the test's sample set has 5 batches, which profile warns of.
@pytest.mark.filterwarnings("ignore:profile. the loader ended:UserWarning")
def test_tuning_example(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")  # result.plot() needs the plot extra
    monkeypatch.chdir(workdir)
    code = example("result = autotune(").replace("time_budget_s=30", "time_budget_s=5")
    scope = run(code)
    assert scope["result"].loader_kwargs["batch_size"] == 64
    assert scope["report"].verdict

"""The README is the front door: at most 200 lines, and every Python example in it runs as
written (on a tiny sample dataset, on the CPU).

Each example is found by a line it contains, so reordering the README does not break the
test; the longer examples live in the guides (``docs/guides/``), run by ``test_docs.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import make_demo_workdir
from tests.preprocess.test_ray_engine import (  # noqa: F401
    _ray_folder,
    _ray_module,
    ray_instance,
)

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 200

# the line that finds each README example, the one the tests below run
EXAMPLES = ('summary = preprocess("demo-data/sample"', 'train = ShardDataset("out/"', "autotune(")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def example(marker: str) -> str:
    """The README's ```python block that contains ``marker``."""
    found = [block for block in python_blocks() if marker in block]
    assert len(found) == 1, f"{len(found)} README examples contain {marker!r}"
    return found[0]


def run(code: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    scope = dict(namespace or {})
    exec(compile(code, str(README), "exec"), scope)
    return scope


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; at most {MAX_LINES}"


def test_every_python_example_is_run_here() -> None:
    """A new README example needs a test here (its marker in ``EXAMPLES``)."""
    blocks = python_blocks()
    assert sorted(blocks) == sorted(example(marker) for marker in EXAMPLES)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sample_tool: Any) -> Path:
    """The demo folder, its ``out/`` written by the README's own preprocessing example,
    run as the README shows it: a script's guarded main block."""
    code = example(EXAMPLES[0])
    return make_demo_workdir(
        tmp_path_factory.mktemp("readme"),
        sample_tool,
        lambda: run(code, {"__name__": "__main__"})["summary"],
    )


def test_training_example(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    scope = run(example(EXAMPLES[1]))
    images, labels = scope["images"], scope["labels"]  # the last batch of the second epoch
    assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.bfloat16
    assert labels.dtype == torch.int64 and len(labels) == len(images)
    assert len(scope["in_ram"]) == len(scope["train"])
    in_ram = scope["in_ram"].__getitems__([0, 1])[0]
    assert in_ram.shape == (2, 3, 224, 224) and in_ram.dtype == torch.uint8


# The example profiles steps=50; the test's sample set has 5 batches, which profile warns of.
@pytest.mark.filterwarnings("ignore:profile. the loader ended:UserWarning")
def test_autotune_example(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    code = example(EXAMPLES[2]).replace("time_budget_s=30", "time_budget_s=5")
    scope = run(code)
    assert scope["result"].loader_kwargs["batch_size"] == 64
    assert scope["report"].verdict

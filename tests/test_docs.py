"""The documentation site: every public package has an API reference page, and the quick
start runs as written (on a tiny sample dataset, on the CPU).

The site build itself (``mkdocs build --strict``: broken references, pages missing from
the nav, docstrings mkdocstrings cannot parse) runs in ``make test`` and ``make docs``.
"""

from __future__ import annotations

import pkgutil
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

import fastdata
from fastdata.cli import main

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

"""Every shell line of the README, the home page, the quick start and the guides runs as
written, or is exempt with its reason.

The lines are collected from the pages' ```bash blocks (``&&`` chains split, comments
dropped). A ``fastdata ...`` line runs through :func:`fastdata.cli.main` (preprocess lines
with ``-q --workers 1`` appended: one process on a shared machine); a ``python tools/...``
or ``python examples/...`` line runs in a subprocess with this interpreter. Each page's
lines run in order in a folder of their own holding the inputs under the names the pages
use, tiny: a line whose sizes or placeholders do not fit runs as its entry in
:data:`SUBSTITUTED` instead. The object-storage lines (``s3://``) run against a local S3
server in ``tests/storage/test_guide.py``; the ``--engine ray`` lines on a private local Ray
instance here, under the ``ray`` marker. The detection guide's alternatives that write one
folder run with ``--overwrite`` (:data:`ALTERNATIVES`). What cannot run here is in
:data:`EXEMPT` (or :data:`EXEMPT_PAGES`), with the reason; a line neither run nor exempt,
or an exemption or substitution that matches no line, fails
:func:`test_every_command_line_is_run_or_exempt`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from fastdata.cli import main
from fastdata.shards import load_manifest
from tests.detection_sets import painted_photos, write_coco, write_voc, write_yolo
from tests.preprocess.test_ray_engine import (  # noqa: F401
    _ray_folder,
    _ray_module,
    ray_instance,
)

ROOT = Path(__file__).resolve().parents[1]
PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "quickstart.md",
    *sorted((ROOT / "docs" / "guides").glob("*.md")),
    ROOT / "docs" / "benchmarks.md",
)

# Whole pages whose lines are exempt.
EXEMPT_PAGES = {
    "docs/benchmarks.md": "benchmark runs (minutes, several peers installed); the benchmark "
    "tests run their --quick paths where those exist",
}

# Lines that cannot run here, each with its reason.
EXEMPT = {
    "make demo": "builds a second virtual environment (minutes, network)",
    "make test": "builds a second virtual environment and runs this suite",
    "make docs": "the site build runs in `make test` and `make docs` (mkdocs build --strict)",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": "an install (network)",
    "pip install .": "an install (network)",
    "pip install -e .": "an install (network)",
    "pip install -e '.[gpu]'": "an install (network)",
    "pip install -e '.[ray]'": "an install (network)",
    "pip install -e '.[s3]'": "an install (network)",
    "python3 -m venv /tmp/peers": "creates the benchmark's virtual environment for its peers",
    "echo 'torch==2.13.0' > /tmp/pin.txt": "writes the benchmark environment's pin file",
    "/tmp/peers/bin/pip install torch==2.13.0": "an install (network)",
    "/tmp/peers/bin/pip install -c /tmp/pin.txt litdata mosaicml-streaming webdataset boto3 "
    "'moto[server]'": "an install of the benchmark's peers (network)",
    "/tmp/peers/bin/pip install -c /tmp/pin.txt -e '.[s3]'": "an install (network)",
    "PYTHONPATH=benchmarks /tmp/peers/bin/python benchmarks/bench_storage.py --publish": (
        "a benchmark run with its peers installed (minutes); tests/storage covers fastdata's "
        "side of it"
    ),
    "fastdata preprocess /shared/imagenet /shared/out --engine ray --address auto "
    "--shard-mb 256": "needs a running Ray cluster (`--address auto`) and its shared folder",
}

# Lines that run with other arguments here: tiny sizes, short budgets, placeholders filled.
SUBSTITUTED = {
    "python tools/make_sample_dataset.py demo-data/sample --num-images 4000": (
        "python tools/make_sample_dataset.py demo-data/sample --num-images 128 --size 64 48 "
        "--workers 1"
    ),
    "fastdata preprocess SRC OUT --size 224": (
        "fastdata preprocess demo-data/sample out/ --size 224"
    ),
    "fastdata preprocess SRC OUT --coco ann.json": (
        "fastdata preprocess coco/images out-det/ --coco coco/instances_train.json"
    ),
    "fastdata inspect OUT": "fastdata inspect out/",
    "fastdata verify OUT": "fastdata verify out/",
    "fastdata tune OUT --batch-size 256": "fastdata tune out/ --batch-size 64 --time-budget 3",
    "fastdata tune out/ --batch-size 64 --time-budget 30": (
        "fastdata tune out/ --batch-size 64 --time-budget 3"
    ),
    # the guide's [--in-memory] [--step-ms 20]: optional flags, given here
    "fastdata tune out/ --batch-size 64 --time-budget 30 [--in-memory] [--step-ms 20]": (
        "fastdata tune out/ --batch-size 64 --time-budget 3 --in-memory --step-ms 20"
    ),
    "fastdata tune out-jpeg/ --batch-size 64 --crop 224 --random-crop": (
        "fastdata tune out-jpeg/ --batch-size 64 --crop 224 --random-crop --time-budget 3"
    ),
    "fastdata preprocess coco/images out-det/ --coco coco/instances_train.json --size 640": (
        "fastdata preprocess coco/images out-det/ --coco coco/instances_train.json --size 64"
    ),
    "fastdata preprocess yolo/images/train out-det/ --yolo yolo/labels/train --size 640": (
        "fastdata preprocess yolo/images/train out-det/ --yolo yolo/labels/train --size 64"
    ),
    "fastdata preprocess images/ out-seg/ --masks masks/ --size 512": (
        "fastdata preprocess images/ out-seg/ --masks masks/ --size 64"
    ),
    "python examples/detection_finetune.py coco/images coco/instances_train.json work/ "
    "--epochs 5 --save work/detector.pt": (
        "python examples/detection_finetune.py coco/images coco/instances_train.json work/ "
        "--epochs 1 --image-size 32 --batch-size 4 --num-workers 0 --save work/detector.pt"
    ),
    "python examples/detection_finetune.py coco/images coco/instances_train.json work/ "
    "--weights work/detector.pt --lr 1e-3": (
        "python examples/detection_finetune.py coco/images coco/instances_train.json work/ "
        "--weights work/detector.pt --lr 1e-3 --epochs 1 --image-size 32 --batch-size 4 "
        "--num-workers 0"
    ),
}

RUN_ELSEWHERE = "tests/storage/test_guide.py"  # the s3:// lines, against a local S3 server


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def command_lines(page: Path) -> list[str]:
    """The commands of ``page``'s ```bash blocks in order: comments dropped, ``&&`` chains
    split, spaces collapsed."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        for line in block.splitlines():
            for command in line.split("#", 1)[0].split("&&"):
                if command.strip():
                    lines.append(" ".join(command.split()))
    return lines


def all_command_lines() -> list[tuple[str, str]]:
    return [(page_name(page), line) for page in PAGES for line in command_lines(page)]


def is_remote(line: str) -> bool:
    return "s3://" in line or "gs://" in line


def is_ray(line: str) -> bool:
    return "--engine ray" in line and line not in EXEMPT


def is_runnable_here(line: str) -> bool:
    words = shlex.split(line)
    script = words[1] if len(words) > 1 else ""
    local_python = words[:1] == ["python"] and script.startswith(("tools/", "examples/"))
    return words[:1] == ["fastdata"] or local_python


def local_lines(page: str) -> list[str]:
    """The lines of ``page`` this module runs without Ray, in order."""
    if page in EXEMPT_PAGES:
        return []
    return [
        line
        for line in command_lines(ROOT / page)
        if line not in EXEMPT and not is_remote(line) and not is_ray(line)
    ]


LOCAL_PAGES = [page_name(page) for page in PAGES if local_lines(page_name(page))]

# A page that reads what another page's lines write runs those lines first.
READS_FROM = {"docs/guides/tune.md": "docs/guides/preprocess.md"}  # out/ and out-jpeg/

# Alternatives that write the folder a line before them wrote: they run with --overwrite.
ALTERNATIVES = {
    "fastdata preprocess yolo/images/train out-det/ --yolo yolo/labels/train --size 640",
    "fastdata preprocess VOC2012/JPEGImages out-det/ --voc VOC2012/Annotations --classes voc.txt",
    "fastdata preprocess coco/images out-det/ --annotations coco/instances_train.json",
}


def test_every_command_line_is_run_or_exempt() -> None:
    lines = all_command_lines()
    assert {page for page, _ in lines} >= {"README.md", "docs/quickstart.md", *EXEMPT_PAGES}
    unhandled = [
        (page, line)
        for page, line in lines
        if page not in EXEMPT_PAGES and line not in EXEMPT and not is_runnable_here(line)
    ]
    assert not unhandled, f"shell lines neither run by a test nor exempt: {unhandled}"
    texts = {line for _, line in lines}
    stale = [line for line in (*EXEMPT, *SUBSTITUTED, *ALTERNATIVES) if line not in texts]
    assert not stale, f"exempt or substituted lines no page has any more: {stale}"
    assert [line for _, line in lines if is_remote(line)], "no s3:// line for " + RUN_ELSEWHERE


def run_line(line: str, replace: dict[str, str] | None = None) -> None:
    """Run one doc line (its :data:`SUBSTITUTED` form where it has one) in the current
    folder; ``replace`` maps words to others first (a bucket name)."""
    words = _replaced(shlex.split(SUBSTITUTED.get(line, line)), replace or {})
    if line in ALTERNATIVES:
        words.append("--overwrite")
    if words[0] == "python":
        result = subprocess.run(
            [sys.executable, str(ROOT / words[1]), *words[2:]],
            capture_output=True,
            text=True,
            check=False,
            env=_subprocess_environment(),
        )
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
        return
    args = words[1:]
    if args[0] == "preprocess":
        args = [*args, "-q"]
        if "--engine" not in args:
            args += ["--workers", "1"]
    assert main(args) == 0, line


def _replaced(words: list[str], replace: dict[str, str]) -> list[str]:
    out = []
    for word in words:
        replaced = word
        for old, new in replace.items():
            replaced = replaced.replace(old, new)
        out.append(replaced)
    return out


def _subprocess_environment() -> dict[str, str]:
    environment = dict(os.environ)
    # this checkout's fastdata first, as in the test process
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [environment.get("PYTHONPATH")])]
    )
    return environment


MAKE_SAMPLE = "python tools/make_sample_dataset.py demo-data/sample"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The inputs the pages name, tiny: ``demo-data/sample`` (as the pages'
    ``make_sample_dataset.py`` line makes it, here), segmentation pairs ``images/`` +
    ``masks/``, ``list.csv`` over those images, and a detection set as COCO (``coco/``),
    YOLO (``yolo/``) and VOC (``VOC2012/`` + ``voc.txt``)."""
    root = tmp_path_factory.mktemp("doc-inputs")
    (make_sample,) = {line for line in SUBSTITUTED if line.startswith(MAKE_SAMPLE)}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        run_line(make_sample)
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    (root / "masks").mkdir()
    for index in range(4):
        image = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        cv2.imwrite(str(root / "images" / f"{index}.jpg"), image)
        cv2.imwrite(str(root / "masks" / f"{index}.png"), image[..., 0] % 3)
    (root / "list.csv").write_text(
        "path,label\n" + "".join(f"images/{i}.jpg,{i % 2}\n" for i in range(4))
    )
    photos = painted_photos(root / "coco" / "images", num_images=8)
    write_coco(photos, root / "coco" / "instances_train.json")
    yolo = painted_photos(root / "yolo" / "images" / "train", num_images=8)
    write_yolo(yolo, root / "yolo" / "labels" / "train")
    voc = painted_photos(root / "VOC2012" / "JPEGImages", num_images=8)
    write_voc(voc, root / "VOC2012" / "Annotations")
    (root / "voc.txt").write_text("\n".join(voc.class_names) + "\n")
    return root


def page_folder(inputs: Path, folder: Path, page: str) -> Path:
    """``folder`` with links to the inputs; ``demo-data/`` only where the page does not
    make it with its own line."""
    folder.mkdir(parents=True, exist_ok=True)
    makes_sample = any(line.startswith(MAKE_SAMPLE) for line in local_lines(page))
    for entry in inputs.iterdir():
        if not (makes_sample and entry.name == "demo-data"):
            (folder / entry.name).symlink_to(entry)
    return folder


# tune profiles a few batches of a 128-image set, which it warns of
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("page", LOCAL_PAGES)
def test_the_pages_command_lines_run(
    page: str, inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's lines in order, in a folder of their own holding the inputs: a line reads
    what the lines before it wrote (or, per :data:`READS_FROM`, another page's)."""
    monkeypatch.chdir(page_folder(inputs, tmp_path, page))
    lines = [*local_lines(READS_FROM[page])] if page in READS_FROM else []
    for line in [*lines, *local_lines(page)]:
        run_line(line)


def test_the_lines_write_what_the_pages_say(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spot checks of what the detection and preprocessing guides' lines wrote."""
    monkeypatch.chdir(page_folder(inputs, tmp_path, "docs/guides/preprocess.md"))
    for line in local_lines("docs/guides/preprocess.md"):
        run_line(line)
    assert load_manifest("out-seg/").num_samples == 4
    assert load_manifest("out-gray/").num_samples == 4
    assert load_manifest("out-det/").num_samples == 8
    assert load_manifest("out/").num_samples == 128


@pytest.mark.ray
def test_every_ray_command_line_runs(
    inputs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ray_instance: Any,  # noqa: F811
) -> None:
    monkeypatch.chdir(page_folder(inputs, tmp_path, "docs/guides/distributed.md"))
    ray_lines = sorted({line for _, line in all_command_lines() if is_ray(line)})
    assert len(ray_lines) == 1  # the README's and the scale-out guide's
    for line in ray_lines:
        run_line(line)
        assert load_manifest(shlex.split(line)[3]).num_samples == 128

"""Packaging metadata: the distribution name, the license, and extras that match the code.

Read from pyproject.toml and the sources, so a renamed extra, an install hint naming a
distribution that is not ours, or a test dependency missing from the ``test`` extra fails
here rather than on a user's machine.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from fastdata import _optional

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
# First-party modules the tests and tools import by their own names.
LOCAL_MODULES = {"fastdata", "tests", "make_sample_dataset", "_harness", "conftest"}


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def canonicalize_name(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirement strings."""
    names = set()
    for text in requirements:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
        assert match, text
        names.add(canonicalize_name(match.group(1)))
    return names


def test_the_distribution_name_is_ours_and_hints_use_it(project: dict[str, Any]) -> None:
    # "fastdata" on PyPI is an unrelated project: every install hint names this distribution.
    assert project["name"] == "torch-fastdata" == _optional.DISTRIBUTION
    assert project["scripts"] == {"fastdata": "fastdata.cli:main"}
    hint = _optional.install_hint("ray")
    assert hint == "pip install 'torch-fastdata[ray]' (or pip install 'ray')"
    offenders = []
    for path in [*ROOT.joinpath("fastdata").rglob("*.py"), ROOT / "README.md"]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pip install '?fastdata\b", line) and "unrelated" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_license_file_matches_the_metadata(project: dict[str, Any]) -> None:
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_extras(project: dict[str, Any]) -> None:
    extras = project["optional-dependencies"]
    assert _names(extras["dali-cu12"]) == {"nvidia-dali-cuda120"}
    assert _names(extras["dali-cu13"]) == {"nvidia-dali-cuda130"}
    assert extras["dali"] == extras["dali-cu13"]
    assert extras["gpu"] == ["torchvision>=0.20"]
    # Every extra an install hint names exists.
    for module, (_, extra, _) in _optional._PROVIDERS.items():
        assert not extra or extra in extras, f"{module}: extra {extra!r} is not in pyproject"
    # The demo needs the sample dataset's photographs and nothing heavy.
    assert _names(extras["demo"]) == {"scikit-image"}


def _imported_modules(path: Path) -> set[str]:
    """Names of the modules a file imports, including ``importorskip`` and ``import_optional``
    calls with a literal name (``find_spec`` probes are left out: tests use them to skip)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in {"importorskip", "import_optional"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def test_the_test_extra_brings_everything_the_suite_imports(project: dict[str, Any]) -> None:
    extras = project["optional-dependencies"]
    # The gpu extra's torchvision needs a torch build of its own: its tests skip without it
    # and `make .venv/.installed-test,gpu` installs it.
    provided = _names(project["dependencies"]) | _names(extras["test"]) | _names(extras["gpu"])
    distributions = metadata.packages_distributions()
    files = [*ROOT.joinpath("tests").rglob("*.py"), ROOT / "tools" / "make_sample_dataset.py"]
    missing = set()
    for path in files:
        for module in _imported_modules(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in LOCAL_MODULES or top == "nvidia":
                continue
            candidates = {canonicalize_name(name) for name in distributions.get(top, [top])}
            if not candidates & provided:
                missing.add(f"{module} ({path.relative_to(ROOT)})")
    # `dali`- and `ray`-marked tests run only when these are installed (tests/conftest.py).
    assert {"nvidia-dali-cuda130", "ray", "pytest"} <= provided
    assert sorted(missing) == []


def _tracked() -> list[str]:
    """This checkout's files under version control."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True)
    return [name for name in listed.stdout.decode().split("\0") if (ROOT / name).is_file()]


def _wheel_files(tmp_path: Path, **env: str) -> set[str]:
    """The files of a wheel built from this checkout's tracked files, as pip builds it."""
    source = tmp_path / "source"
    for name in _tracked():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip, "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if not name.startswith("torch_fastdata-")}


def test_the_wheel_carries_the_package_its_types_and_the_compiled_module(tmp_path: Path) -> None:
    files = _wheel_files(tmp_path)
    assert {"fastdata/__init__.py", "fastdata/py.typed", "fastdata/_lookup.pyi"} <= files
    assert [name for name in files if name.startswith("fastdata/_lookup.cpython")]
    assert not [name for name in files if not name.startswith("fastdata/")]  # no tests, tools
    assert not [name for name in files if name.endswith(".c")]  # the source stays in the sdist
    modules = {name for name in files if name.endswith(".py")}
    assert modules == {n for n in _tracked() if n.startswith("fastdata/") and n.endswith(".py")}


def test_without_a_compiler_the_wheel_builds_without_the_compiled_module(tmp_path: Path) -> None:
    files = _wheel_files(tmp_path, CC="/bin/false")
    assert "fastdata/_lookup.pyi" in files and "fastdata/gpu/normalize.py" in files
    assert not [name for name in files if name.startswith("fastdata/_lookup.cpython")]

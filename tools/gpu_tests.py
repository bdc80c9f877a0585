"""Run the `gpu`-marked tests with the Python running this script, installing nothing.

What ``make test-gpu`` runs. It suits a GPU machine whose Python already has a CUDA build
of torch (and torchvision, for nvJPEG) and no package registry: nothing is installed and
nothing is fetched; this checkout is put first on ``PYTHONPATH``. It prints one line per
package it looks for: what fastdata needs must be there (else exit 2, naming the pip
command to run where a registry is reachable); an optional package that is absent
(torchvision, DALI, Ray, psutil) is reported in one line and its tests skip, and a test
module that imports an absent package at its top (directly or through fastdata or
tests modules) is left out of the collection, one line per package.

    python3 tools/gpu_tests.py [--allow-cpu] [pytest paths or options ...]

``--allow-cpu`` runs the same path where CUDA is missing (the `gpu` tests then skip): a dry
run of this script, as CI does. Exit status: pytest's, or 2 when the environment cannot run
the tests.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Import name -> distribution, for what fastdata imports whatever the test (pyproject's
# dependencies), and what the test run itself needs.
REQUIRED = {
    "torch": "torch",
    "numpy": "numpy",
    "h5py": "h5py",
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
    "tqdm": "tqdm",
    "simplejpeg": "simplejpeg",
    "pytest": "pytest",
}
# Import name -> (distribution, what skips without it).
OPTIONAL = {
    "torchvision": ("torchvision", "the nvjpeg decoder tests skip"),
    "nvidia.dali": ("nvidia-dali-cuda130", "the DALI tests skip"),
    "ray": ("ray", "the Ray tests skip (none is gpu-marked)"),
    "psutil": ("psutil", "fastdata.tune and its tests (none gpu-marked) cannot be imported"),
}
LOCAL_PACKAGES = ("fastdata", "tests")


def is_present(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path, nothing imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken spec
        return False


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "present"  # e.g. importable from PYTHONPATH without metadata


def environment_lines(
    required: dict[str, str] = REQUIRED,
    optional: dict[str, tuple[str, str]] = OPTIONAL,
) -> tuple[list[str], list[str]]:
    """One line per package (``present: ...`` / ``absent: ...``), and the distributions of
    the required ones that are absent."""
    lines, missing = [], []
    for module, distribution in required.items():
        if is_present(module):
            lines.append(f"present: {distribution} {_version(distribution)}")
        else:
            lines.append(f"absent: {distribution} (required)")
            missing.append(distribution)
    for module, (distribution, consequence) in optional.items():
        if is_present(module):
            lines.append(f"present: {distribution} {_version(distribution)}")
        else:
            lines.append(f"absent: {distribution}: {consequence}")
    return lines, missing


def _top_level_imports(path: Path) -> set[str]:
    """Modules a file imports when it is imported (its top-level import statements; not
    those inside functions, ``try`` or ``if TYPE_CHECKING``), with ``from a import b`` also
    naming ``a.b`` (a submodule, or a name that is not a module)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _local_files(module: str, root: Path) -> list[Path]:
    """The files importing ``module`` (of this checkout) runs: its parent packages'
    ``__init__.py`` and its own file; none for other modules."""
    parts = module.split(".")
    if parts[0] not in LOCAL_PACKAGES:
        return []
    files = []
    for end in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:end])
        if (base / "__init__.py").is_file():
            files.append(base / "__init__.py")
        elif base.with_suffix(".py").is_file():
            files.append(base.with_suffix(".py"))
    return files


def absent_imports(
    path: Path, root: Path = ROOT, _seen: dict[Path, set[str]] | None = None
) -> set[str]:
    """The absent top-level packages that importing ``path`` would import, following the
    imports of this checkout's ``fastdata`` and ``tests`` modules."""
    seen = {} if _seen is None else _seen
    if path in seen:
        return seen[path]
    seen[path] = missing = set()  # a cycle back here adds nothing
    for module in _top_level_imports(path):
        top = module.split(".")[0]
        if top in LOCAL_PACKAGES:
            for local in _local_files(module, root):
                missing |= absent_imports(local, root, seen)
        elif top not in sys.stdlib_module_names and not is_present(top):
            missing.add(top)
    return missing


def uncollectable(root: Path = ROOT) -> dict[str, list[Path]]:
    """Absent package -> the test modules under ``root/tests`` that import it."""
    by_package: dict[str, list[Path]] = {}
    seen: dict[Path, set[str]] = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        for package in sorted(absent_imports(path, root, seen)):
            by_package.setdefault(package, []).append(path)
    return by_package


def cuda_line() -> tuple[str, bool]:
    """A line on torch's CUDA build and devices, and whether a device is usable."""
    import torch  # noqa: PLC0415 - only once torch is known to be present

    available = torch.cuda.is_available()
    if not available:
        return (
            f"torch {torch.__version__}: no CUDA device (CUDA build: {torch.version.cuda})",
            False,
        )
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return f"torch {torch.__version__} CUDA {torch.version.cuda}: {names}", True


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    allow_cpu = "--allow-cpu" in args
    pytest_args = [arg for arg in args if arg != "--allow-cpu"] or ["tests"]
    print(f"python: {sys.executable} {sys.version.split()[0]}", flush=True)
    lines, missing = environment_lines()
    print("\n".join(lines), flush=True)
    if missing:
        print(
            f"cannot run: fastdata or the test run needs {', '.join(missing)}; where a registry "
            f"is reachable: {sys.executable} -m pip install {' '.join(missing)}",
            flush=True,
        )
        return 2
    line, has_cuda = cuda_line()
    print(line, flush=True)
    if not has_cuda and not allow_cpu:
        print("cannot run: no CUDA device (--allow-cpu runs the same path, every gpu test skipped)")
        return 2
    ignores = []
    for package, paths in uncollectable().items():
        print(
            f"absent: {package}: {len(paths)} test module(s) importing it not collected", flush=True
        )
        ignores += [f"--ignore={path.relative_to(ROOT)}" for path in paths]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PIP_NO_INDEX"] = "1"  # nothing here may reach a registry
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    print("running:", " ".join([*command, *pytest_args]), flush=True)
    return subprocess.call([*command, *ignores, *pytest_args], cwd=ROOT, env=env)


if __name__ == "__main__":
    raise SystemExit(main())

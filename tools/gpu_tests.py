"""Run the `gpu`-marked tests with the Python running this script, installing nothing.

What ``make test-gpu`` runs. It suits a GPU machine whose Python already has a CUDA build
of torch (and torchvision, for nvJPEG) and no package registry: nothing is installed and
nothing is fetched; this checkout is put first on ``PYTHONPATH``. It prints one line per
package it looks for: what fastdata needs must be there (else exit 2, naming the pip
command to run where a registry is reachable); an optional package that is absent
(torchvision, DALI, Ray) is reported in one line and its tests skip.

    python3 tools/gpu_tests.py [--allow-cpu] [pytest paths or options ...]

``--allow-cpu`` runs the same path where CUDA is missing (the `gpu` tests then skip): a dry
run of this script, as CI does. Exit status: pytest's, or 2 when the environment cannot run
the tests.
"""

from __future__ import annotations

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
    "psutil": "psutil",
    "pytest": "pytest",
}
# Import name -> (distribution, what skips without it).
OPTIONAL = {
    "torchvision": ("torchvision", "the nvjpeg decoder tests skip"),
    "nvidia.dali": ("nvidia-dali-cuda130", "the DALI tests skip"),
    "ray": ("ray", "the Ray tests skip (none is gpu-marked)"),
}


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
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PIP_NO_INDEX"] = "1"  # nothing here may reach a registry
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    print("running:", " ".join([*command, *pytest_args]), flush=True)
    return subprocess.call([*command, *pytest_args], cwd=ROOT, env=env)


if __name__ == "__main__":
    raise SystemExit(main())

"""``make test-gpu`` (tools/gpu_tests.py) on a machine with no registry: it installs
nothing, runs with the Python it is given, and says in one line each what is absent. CI
runs the whole path as a dry run on the CPU (``--allow-cpu``: every gpu test skips)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_tests.py"


@pytest.fixture(scope="module")
def gpu_tests() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_tests", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    return subprocess.run(
        [make, "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_make_test_gpu_installs_nothing_and_uses_the_python_given() -> None:
    planned = _make("-n", "test-gpu", f"PY={sys.executable}")
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.strip() == f"{sys.executable} tools/gpu_tests.py"
    assert "pip install" not in planned.stdout and "-m venv" not in planned.stdout


def test_make_test_gpu_dry_run_on_the_cpu() -> None:
    done = _make(
        "test-gpu",
        f"PY={sys.executable}",
        "GPU_TEST_ARGS=--allow-cpu tests/gpu/test_cuda.py",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"python: {sys.executable}" in out
    assert "present: torch " in out and "present: pytest " in out
    assert "-m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_cuda.py" in out
    if not shutil.which("nvidia-smi"):
        assert "skipped" in out.splitlines()[-1]  # every gpu test, with its reason


def test_each_absent_package_is_one_line_and_a_required_one_stops(gpu_tests: Any) -> None:
    lines, missing = gpu_tests.environment_lines(
        {"torch": "torch", "no_such_module_here": "no-such-dist"},
        {"nvidia.no_such_module": ("no-such-optional", "its tests skip")},
    )
    assert lines[0].startswith("present: torch ")
    assert lines[1:] == [
        "absent: no-such-dist (required)",
        "absent: no-such-optional: its tests skip",
    ]
    assert missing == ["no-such-dist"]


def test_a_missing_requirement_exits_2_with_the_pip_command(
    gpu_tests: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(gpu_tests.REQUIRED, "no_such_module_here", "no-such-dist")
    ran: list[object] = []
    monkeypatch.setattr(gpu_tests.subprocess, "call", lambda *a, **k: ran.append(a) or 0)
    assert gpu_tests.main(["--allow-cpu"]) == 2
    assert ran == []
    assert "-m pip install no-such-dist" in capsys.readouterr().out


def test_without_cuda_it_refuses_unless_allowed(
    gpu_tests: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_tests, "cuda_line", lambda: ("torch x: no CUDA device", False))
    calls: list[tuple[list[str], dict[str, str]]] = []

    def call(command: list[str], *, cwd: Path, env: dict[str, str]) -> int:
        calls.append((command, env))
        return 0

    monkeypatch.setattr(gpu_tests.subprocess, "call", call)
    assert gpu_tests.main([]) == 2 and calls == []
    assert gpu_tests.main(["--allow-cpu", "tests/gpu"]) == 0
    ((command, env),) = calls
    assert command[-1] == "tests/gpu" and "--allow-cpu" not in command
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT)  # this checkout first
    assert env["PIP_NO_INDEX"] == "1"


def test_test_modules_importing_an_absent_package_are_left_out(
    gpu_tests: Any, tmp_path: Path
) -> None:
    files = {
        "fastdata/__init__.py": "",
        "fastdata/tune/__init__.py": "from fastdata.tune._measure import x\n",
        "fastdata/tune/_measure.py": "import no_such_package_here\n",
        "fastdata/ok.py": "import os\n\ndef later():\n    import another_absent_one\n",
        "tests/__init__.py": "",
        "tests/helper.py": "import no_such_package_here.sub\n",
        "tests/test_direct.py": "import no_such_package_here\n",
        "tests/test_through_fastdata.py": "from fastdata.tune import autotune\n",
        "tests/test_through_tests.py": "from tests.helper import thing\n",
        "tests/test_fine.py": "import os\nimport pytest\nfrom fastdata.ok import later\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = gpu_tests.uncollectable(tmp_path)
    assert {package: [p.name for p in paths] for package, paths in found.items()} == {
        "no_such_package_here": [
            "test_direct.py",
            "test_through_fastdata.py",
            "test_through_tests.py",
        ]
    }

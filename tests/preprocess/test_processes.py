"""Worker processes: started from scripts, stdin and notebooks; gone when the parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from fastdata.errors import PreprocessError
from fastdata.preprocess import PreprocessOptions, preprocess
from fastdata.shards import ShardReader
from tests.preprocess.conftest import alive

REPO = Path(__file__).resolve().parents[2]


def _images(root: Path, count: int, side: int = 96) -> Path:
    rng = np.random.default_rng(0)
    encoded = [
        cv2.imencode(".jpg", rng.integers(0, 256, (side, side * 4 // 3, 3), dtype=np.uint8))[1]
        for _ in range(8)
    ]
    for i in range(count):
        folder = root / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(encoded[i % len(encoded)].tobytes())
    return root


def _run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, input=stdin, capture_output=True, text=True,
        env=env, timeout=300, check=False,
    )  # fmt: skip


_UNGUARDED = """
from fastdata.preprocess import PreprocessOptions, preprocess
summary = preprocess({src!r}, {out!r}, PreprocessOptions(sizes=(16,)), workers=2,
                     show_progress=False)
print("stored", summary.num_samples)
"""


def test_unguarded_script_runs(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 40, side=32)
    script = tmp_path / "job.py"
    script.write_text(_UNGUARDED.format(src=str(src), out=str(tmp_path / "out")))
    done = _run([str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "stored 40" in done.stdout and "Traceback" not in done.stderr
    assert len(ShardReader(tmp_path / "out")) == 40


def test_script_from_stdin_runs(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 40, side=32)
    code = _UNGUARDED.format(src=str(src), out=str(tmp_path / "out"))
    done = _run(["-"], tmp_path, stdin=code)
    assert done.returncode == 0, done.stderr
    assert "stored 40" in done.stdout and "Traceback" not in done.stderr


def test_a_job_that_needs_main_says_how_to_guard_the_call(tmp_path: Path) -> None:
    """Where the workers must import the script (the job refers to objects defined in it),
    an unguarded call is one clear error before any process starts; a guarded one is not."""
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from fastdata.preprocess._pool import unguarded_main_call

            def check():
                return unguarded_main_call(sys.modules["__main__"])

            print("top", check())
            if __name__ == "__main__":
                print("guarded", check())
            """
        )
    )
    done = _run([str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"top ('{script}', 8)" in done.stdout and "guarded None" in done.stdout


def test_workers_need_nothing_from_main_and_main_is_restored(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 20, side=32)
    main = sys.modules["__main__"]
    before = (getattr(main, "__file__", None), getattr(main, "__spec__", None))
    options = PreprocessOptions(sizes=(16,))
    preprocess(src, tmp_path / "out", options, workers=2, show_progress=False)
    assert (getattr(main, "__file__", None), getattr(main, "__spec__", None)) == before


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def _maps(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:  # gone meanwhile
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("group", [False, True], ids=["parent", "process-group"])
def test_kill_9_leaves_no_worker_and_no_named_semaphore(tmp_path: Path, group: bool) -> None:
    src = _images(tmp_path / "src", 3000, side=240)
    script = tmp_path / "job.py"
    script.write_text(
        "from fastdata.preprocess import PreprocessOptions, preprocess\n"
        'if __name__ == "__main__":\n'
        f"    preprocess({str(src)!r}, {str(tmp_path / 'out')!r}, PreprocessOptions(sizes=(64,)),"
        " workers=2, show_progress=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], env=env, cwd=tmp_path, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        workers: set[int] = set()
        while time.monotonic() < deadline and parent.poll() is None:
            workers = _children(parent.pid)
            busy = [p for p in workers if b"resource_tracker" not in _cmdline(p)]
            if len(busy) >= 2 and (tmp_path / "out" / ".fastdata-job").exists():
                break
            time.sleep(0.05)
        assert parent.poll() is None, "the job ended before it could be killed"
        everyone = [parent.pid, *workers]
        # glibc maps a semaphore from a temporary file that it then links under its name:
        # a mapped inode that still has a name in /dev/shm is one a kill would leave there
        mapped = {
            int(line.split()[4])
            for pid in everyone
            for line in _maps(pid)
            if "/dev/shm/sem." in line
        }
        named = {entry.stat().st_ino: entry.name for entry in Path("/dev/shm").iterdir()}
        assert [named[inode] for inode in mapped if inode in named] == []
        if group:
            os.killpg(parent.pid, signal.SIGKILL)
        else:
            parent.kill()
        parent.wait()
        # a worker still starting (importing) arms its parent check when it gets going
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in workers):
            time.sleep(0.05)
        assert not [p for p in workers if alive(p)], "processes outlived their parent"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


def test_a_worker_that_dies_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastdata.preprocess import _pool  # noqa: PLC0415

    src = _images(tmp_path / "src", 40, side=32)
    monkeypatch.setattr(_pool, "CHUNK_ITEMS", 4)
    pool = _pool.WorkerPool(2, _job(src, tmp_path / "out"))
    try:
        os.kill(pool._processes[0].pid, signal.SIGKILL)  # what the OOM killer does
        items = list(_listing(src).items)
        died = r"worker process \(pid \d+\) exited with code -9"
        with pytest.raises(PreprocessError, match=died):
            for _ in pool.results(items, len(items), lambda n: None):
                pass
    finally:
        pool.close()


def _listing(src: Path):  # type: ignore[no-untyped-def]
    from fastdata.preprocess._sources import list_source  # noqa: PLC0415

    return list_source(src)


def _job(src: Path, out: Path):  # type: ignore[no-untyped-def]
    from fastdata.preprocess._task import build_fields  # noqa: PLC0415
    from fastdata.preprocess.engine import ShardJob  # noqa: PLC0415

    listing = _listing(src)
    options = PreprocessOptions(sizes=(16,))
    return ShardJob(str(out), options, build_fields(listing, options), listing.kind)


def test_runs_from_a_jupyter_notebook(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = _images(tmp_path / "src", 40, side=32)
    out = tmp_path / "out"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(f"import sys\nsys.path.insert(0, {str(REPO)!r})"),
        nbformat.v4.new_code_cell(
            "from fastdata.preprocess import PreprocessOptions, preprocess\n"
            f"summary = preprocess({str(src)!r}, {str(out)!r}, PreprocessOptions(sizes=(16,)),"
            " workers=2, show_progress=False)\n"
            "print(summary.num_samples)"
        ),
    ]
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    outputs = notebook.cells[1].outputs
    printed = [o.get("text", "").strip() for o in outputs if o.get("name") == "stdout"]
    assert printed == ["40"]
    assert len(ShardReader(out)) == 40


_BLOCKING_DATASET = """
import os
import time

import numpy as np


class Blocking:
    '''Items 8..39 block (the workers reach them; the listing probes 0, 32 and 63 only
    in the parent, which the marker leaves out).'''

    def __len__(self):
        return 64

    def __getitem__(self, index):
        if 8 <= index < 40 and index != 32:
            open(os.path.join(os.environ["MARKS"], str(os.getpid())), "w").close()
            time.sleep(600)
        return np.zeros((8, 8, 3), np.uint8), 0


dataset = Blocking()
"""

_SPAWNED_JOB = """
import sys

from fastdata.preprocess import PreprocessOptions, preprocess
from fastdata.preprocess.engine import LocalEngine

from blocking import dataset

if __name__ == "__main__":
    try:
        preprocess(dataset, sys.argv[1], PreprocessOptions(sizes=(8,)), show_progress=False,
                   engine=LocalEngine(2, start_method="spawn"))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
"""


@pytest.mark.parametrize("how", ["cli", "spawn"])
def test_ctrl_c_leaves_the_workers_quiet(tmp_path: Path, how: str) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while both
    workers are busy: one clean line from the parent, no worker tracebacks."""
    (tmp_path / "blocking.py").write_text(_BLOCKING_DATASET)
    (tmp_path / "job.py").write_text(_SPAWNED_JOB)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARKS": str(marks), "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    if how == "cli":
        args = ["-m", "fastdata", "preprocess", "--from-python", "blocking:dataset", "out"]
        args += ["--size", "8", "--workers", "2", "-q"]
    else:
        args = ["job.py", "out"]
    # a child inherits an ignored SIGINT (a shell's background job ignores it) but not a
    # handler: with one installed here, the child starts with the default disposition
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, *args], cwd=tmp_path, env=env, text=True, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 2 and process.poll() is None:
            assert time.monotonic() < deadline, "the workers never reached the blocking items"
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    expected = "fastdata preprocess: interrupted" if how == "cli" else "interrupted"
    assert stderr.strip() == expected

"""The Ray engine: on a Ray instance in this process (2 CPUs, loopback), on a 2-node
loopback cluster, and from the CLI beside a running ``ray start --head`` instance.

Every test that starts Ray processes points ``RAY_TMPDIR`` at a private folder, so that
the address file ``ray start`` writes (which ``ray.init()`` reads) is not the machine's
``/tmp/ray/ray_current_cluster``, which other Ray users on the machine read.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fastdata
from fastdata import PreprocessOptions
from fastdata.cli import main
from fastdata.errors import PreprocessError
from fastdata.preprocess import RayEngine, preprocess

OPTIONS = PreprocessOptions(sizes=(16,), shard_bytes=7 * (16 * 16 * 3 + 64))  # 4 shards of 6
REPO = Path(fastdata.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def _ray_module() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def _ray_folder(_ray_module: Any) -> Iterator[Path]:
    """The private temporary folder of the instance started in this process (removed after
    it is shut down)."""
    folder = Path(tempfile.mkdtemp(prefix="fdray", dir="/tmp"))
    yield folder
    if _ray_module.is_initialized():
        _ray_module.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def ray_instance(_ray_module: Any, _ray_folder: Path) -> Any:
    """Ray running in this process (started once, and again after a test shut it down)."""
    if not _ray_module.is_initialized():
        # "local": a private instance even when `ray start` runs one on this machine
        _ray_module.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=str(_ray_folder),
        )
    return _ray_module


@pytest.fixture
def ray_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private ``RAY_TMPDIR`` (short: Ray's socket paths must fit in 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="fdray", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(folder))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def ray_head(ray_tmpdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``ray start --head`` (1 CPU) as a user would run it; stopped (only it) afterwards."""
    pytest.importorskip("ray")
    port = _free_port()
    # a fixed default port (the dashboard agent's 52365) would collide with another Ray
    # instance on the machine: ask for free ones
    ports = [f"--{name}={_free_port()}" for name in ("dashboard-agent-listen-port",
             "metrics-export-port")]  # fmt: skip
    log = (ray_tmpdir / "head.log").open("wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}", *ports,
         "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    address_file = ray_tmpdir / "ray" / "ray_current_cluster"
    deadline = time.monotonic() + 120
    address = ""
    while not address or not _answers(address):
        if process.poll() is not None or time.monotonic() > deadline:
            log.close()
            process.kill()
            pytest.fail(f"ray start --head failed: {(ray_tmpdir / 'head.log').read_text()}")
        time.sleep(0.5)
        address = address_file.read_text().strip() if address_file.is_file() else ""
    yield address, process
    process.terminate()  # --block: ray start stops the processes it started
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    log.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastdata", "preprocess", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.mark.ray
def test_ray_shards_are_byte_identical_to_local_ones(
    ray_instance: Any, sample_imagefolder: Path, tmp_path: Path
) -> None:
    # workers=1: a forked pool beside the running Ray instance's threads can deadlock
    local = preprocess(
        sample_imagefolder, tmp_path / "local", OPTIONS, workers=1, show_progress=False
    )
    remote = preprocess(
        sample_imagefolder, tmp_path / "ray", OPTIONS, engine=RayEngine(), show_progress=False
    )
    assert remote.num_shards == local.num_shards == 4
    assert ray_instance.is_initialized()  # the engine used the running instance, left it up
    local_files, ray_files = _files(tmp_path / "local"), _files(tmp_path / "ray")
    assert list(ray_files) == ["index.json"] + [f"shard-{i:05d}.h5" for i in range(4)]
    assert ray_files == local_files


@pytest.mark.ray
def test_a_failing_task_stops_the_job_naming_its_input_and_the_rerun_resumes(
    ray_instance: Any, sample_imagefolder: Path, tmp_path: Path
) -> None:
    options = PreprocessOptions(sizes=(16,), shard_bytes=OPTIONS.shard_bytes, on_error="raise")
    last = sorted(sample_imagefolder.glob("*/*.jpg"))[-1]
    good = last.read_bytes()
    last.write_bytes(good[:100])  # truncated JPEG in the last shard
    out = tmp_path / "out"
    engine = RayEngine(max_retries=1)
    with pytest.raises(PreprocessError, match=rf"shard-00003.h5 failed after 2 attempts .*{last}"):
        preprocess(sample_imagefolder, out, options, engine=engine, show_progress=False)
    assert not (out / "index.json").exists()
    assert not list(out.glob(".shard-*"))  # no partial file left
    last.write_bytes(good)
    summary = preprocess(sample_imagefolder, out, options, engine=engine, show_progress=False)
    assert summary.num_reused_shards == 3 and summary.num_processed == 6  # the last shard
    reference = preprocess(
        sample_imagefolder, tmp_path / "local", options, workers=1, show_progress=False
    )
    assert reference.num_shards == 4
    assert _files(out) == _files(tmp_path / "local")


@pytest.mark.ray
def test_cli_engine_ray(
    ray_instance: Any, sample_imagefolder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["preprocess", str(sample_imagefolder), str(tmp_path / "o"), "--engine", "ray"]
    code = main([*args, "--size", "16", "-q"])
    assert code == 0
    assert "24 samples in 1 shard(s)" in capsys.readouterr().out


@pytest.mark.ray
def test_bad_engine_arguments_are_refused(ray_instance: Any) -> None:
    with pytest.raises(ValueError, match="address must be a non-empty string or None, got ''"):
        RayEngine("")
    with pytest.raises(ValueError, match="num_cpus must be >= 1, got 0"):
        RayEngine(num_cpus=0)
    with pytest.raises(TypeError, match="num_cpus must be an int or None"):
        RayEngine(num_cpus=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_retries must be an int >= 0, got -1"):
        RayEngine(max_retries=-1)


def test_without_ray_the_engine_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'torch-fastdata\[ray\]'"):
        RayEngine()
    assert main(["preprocess", str(tmp_path), str(tmp_path / "o"), "--engine", "ray"]) == 1
    assert "pip install 'torch-fastdata[ray]'" in capsys.readouterr().err


def test_address_needs_the_ray_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preprocess", str(tmp_path), str(tmp_path / "o"), "--address", "auto"]) == 2
    assert "--address needs --engine ray" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.slow
def test_cli_joins_a_running_ray_start_instance(
    ray_head: tuple[str, subprocess.Popen[bytes]], sample_imagefolder: Path, tmp_path: Path
) -> None:
    address, head = ray_head
    out = tmp_path / "ray"
    done = _cli(str(sample_imagefolder), str(out), "--engine", "ray", "--size", "16",
                "--shard-mb", str(OPTIONS.shard_bytes / 2**20), "--workers", "2", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"Ray engine: connected to the running Ray instance at {address} (1 CPU)" in (
        done.stderr
    )
    assert "num_cpus=2 (--workers) is ignored" in done.stderr
    assert "24 samples in 4 shard(s)" in done.stdout
    assert head.poll() is None  # the job left the user's instance running
    preprocess(sample_imagefolder, tmp_path / "local", OPTIONS, workers=1, show_progress=False)
    assert _files(out) == _files(tmp_path / "local")


@pytest.mark.ray
@pytest.mark.slow
def test_cli_starts_a_private_instance_when_the_recorded_one_is_gone(
    ray_tmpdir: Path, sample_imagefolder: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    (ray_tmpdir / "ray").mkdir()
    stale = f"127.0.0.1:{_free_port()}"  # what a `ray start` killed without `ray stop` leaves
    (ray_tmpdir / "ray" / "ray_current_cluster").write_text(stale)
    done = _cli(str(sample_imagefolder), str(tmp_path / "o"), "--engine", "ray", "--size", "16",
                "--workers", "1", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"recorded a Ray instance at {stale}, but nothing answers there" in done.stderr
    assert "Ray engine: started a private local Ray instance for this job (1 CPU)" in done.stderr
    assert "24 samples in 1 shard(s)" in done.stdout


@pytest.mark.ray
@pytest.mark.slow
def test_two_node_loopback_cluster_writes_the_local_engines_bytes(
    ray_tmpdir: Path, _ray_module: Any, sample_imagefolder: Path, tmp_path: Path
) -> None:
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    if _ray_module.is_initialized():
        _ray_module.shutdown()  # the address below must be the one this test connects to
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        engine = RayEngine(cluster.address)
        preprocess(sample_imagefolder, tmp_path / "ray", OPTIONS, engine=engine, show_progress=0)
        assert engine.connection == f"connected to the cluster at {cluster.address} (2 CPUs)"
        assert len(cluster.list_all_nodes()) == 2
        assert not _ray_module.is_initialized()  # the engine disconnected when done
    finally:
        if _ray_module.is_initialized():
            _ray_module.shutdown()
        cluster.shutdown()
    preprocess(sample_imagefolder, tmp_path / "local", OPTIONS, workers=1, show_progress=False)
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")


@pytest.mark.ray
def test_a_dataset_object_on_ray(ray_instance: Any, tmp_path: Path) -> None:
    from tests.preprocess import test_python_source as sources  # noqa: PLC0415

    engine = RayEngine()
    preprocess(sources.DictMaskDataset(), tmp_path / "ray", sources.OPTIONS, engine=engine,
               show_progress=False)  # fmt: skip
    preprocess(sources.DictMaskDataset(), tmp_path / "local", sources.OPTIONS, workers=1,
               show_progress=False)  # fmt: skip
    assert len(_files(tmp_path / "ray")) == 5  # index.json and 4 shards, written on Ray
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    with pytest.raises(PreprocessError, match="RayEngine sends the dataset to its workers, but"):
        preprocess(sources.LockedDataset(), tmp_path / "x", sources.OPTIONS, engine=engine)


@pytest.mark.ray
def test_an_address_nobody_answers_is_a_quick_clear_error(
    _ray_module: Any, ray_tmpdir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if _ray_module.is_initialized():
        _ray_module.shutdown()  # the engine must look for an instance itself
    dead = f"127.0.0.1:{_free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", dead)
    started = time.monotonic()
    with pytest.raises(PreprocessError, match=rf"no Ray instance answers at {dead} \(from RAY_ADD"):
        RayEngine()._connect()
    with pytest.raises(PreprocessError, match=rf"answers at {dead} \(from the address given\)"):
        RayEngine(dead)._connect()
    assert time.monotonic() - started < 30  # ray.init() alone retries such an address for minutes
    assert not _ray_module.is_initialized()

"""The Ray engine on one local Ray instance (2 CPUs, loopback), started once per module."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdata import PreprocessOptions
from fastdata.cli import main
from fastdata.errors import PreprocessError
from fastdata.preprocess import RayEngine, preprocess

OPTIONS = PreprocessOptions(sizes=(16,), shard_bytes=7 * (16 * 16 * 3 + 64))  # 4 shards of 6


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


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
    options = PreprocessOptions(sizes=(16,), shard_bytes=OPTIONS.shard_bytes, on_error="fail")
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

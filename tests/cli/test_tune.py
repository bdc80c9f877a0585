"""``fastdata tune PATH --batch-size N`` on a tiny shard set."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.cli import main
from tests.tune.synthetic import write_tiny_shards


@pytest.fixture
def shard_set(tmp_path: Path) -> Path:
    return write_tiny_shards(tmp_path)


@pytest.mark.parametrize("extra", [[], ["--in-memory", "--step-ms", "1"]])
def test_prints_the_table_and_the_recommendation(
    shard_set: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", str(shard_set), "--batch-size", "8", "--time-budget", "3", "--max-workers", "1"]
    assert main([*argv, "--no-progress", *extra]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["configuration", "batches/s"]
    assert "in-process" in out and "1 worker, prefetch 2" in out
    assert "recommended   num_workers=" in out
    assert "why           Reading one batch of 8" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-size", "0"], "must be a positive integer, got 0"),
        (["--batch-size", "4", "--time-budget", "0"], "must be a number > 0, got 0"),
        (["--batch-size", "4", "--step-ms", "-1"], "must be a number >= 0, got -1"),
        (["--batch-size", "4", "--max-workers", "-2"], "must be an integer >= 0, got -2"),
    ],
)
def test_rejects_bad_options(
    shard_set: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", str(shard_set), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_shard_set_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(tmp_path / "nowhere"), "--batch-size", "4"]) == 1
    assert "fastdata tune: error:" in capsys.readouterr().err

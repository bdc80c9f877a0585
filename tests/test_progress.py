"""Progress bars: scaled byte units, few redraws in logs, the phase of a preprocess job,
and progress while a rerun re-hashes finished shards."""

from __future__ import annotations

import io
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdata import PreprocessOptions
from fastdata._progress import LOG_INTERVAL_S, progress_bar
from fastdata.cli import main
from fastdata.preprocess import _runner, preprocess
from fastdata.preprocess import engine as engine_module

# Three 16x16 samples per shard (pixels, label and ~64 bytes of path): 8 shards of 24.
SMALL_SHARDS = PreprocessOptions(sizes=(16,), shard_bytes=3 * (16 * 16 * 3 + 8 + 64))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _redraws(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> int:
    """Carriage-return redraws of a 100-update byte bar over 100+ (fake) seconds."""
    clock = itertools.count(0.0, 1.0)
    monkeypatch.setattr("tqdm.std.time", lambda: next(clock))
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    bar = progress_bar(total=100 << 30, desc="load", unit="B")
    for _ in range(100):
        bar.update(1 << 30)
    bar.close()
    return stream.getvalue().count("\r")


def test_byte_bars_are_scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    _redraws(stream, monkeypatch)
    last = stream.getvalue().strip().split("\r")[-1]
    assert "100G/100G" in last and "GB/s" in last
    assert "107374182400" not in stream.getvalue()


def test_bars_redraw_rarely_when_stderr_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert LOG_INTERVAL_S >= 10
    logged = _redraws(io.StringIO(), monkeypatch)
    terminal = _redraws(_Terminal(), monkeypatch)
    assert logged <= 6  # about one per LOG_INTERVAL_S of the ~130 fake seconds
    assert terminal >= 50


class _Recorder:
    """Stands in for the preprocess bar and records what it is told."""

    def __init__(self, **kwargs: Any) -> None:
        self.events: list[tuple[str, Any]] = []
        self.n = 0
        _Recorder.last = self

    def update(self, count: int) -> None:
        self.n += count
        self.events.append(("update", count))

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        assert refresh  # drawn now, not at the next update
        self.events.append(("postfix", text))

    def close(self) -> None:
        self.events.append(("close", None))

    last: _Recorder


def test_preprocess_shows_that_a_shard_is_being_finalised(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_bar = _runner.progress_bar

    def bar(**kwargs: Any) -> Any:
        return _Recorder() if kwargs["desc"] == "preprocess" else real_bar(**kwargs)

    monkeypatch.setattr(_runner, "progress_bar", bar)
    # Two shards of 12 samples: each shard ends within one of the engine's 16-sample chunks.
    options = PreprocessOptions(sizes=(16,), shard_bytes=12 * (16 * 16 * 3 + 8 + 64))
    preprocess(sample_imagefolder, tmp_path / "o", options, workers=2)
    events = _Recorder.last.events
    postfixes = [text for kind, text in events if kind == "postfix"]
    finalising = [text for text in postfixes if text.startswith("finalising")]
    assert finalising == [f"finalising shard-{i:05d}.h5 (fsync, SHA-256)" for i in range(2)]
    assert postfixes[-1] == ""  # cleared once the last shard landed
    # Each shard is announced once all its samples have been counted.
    counted = 0
    for kind, value in events:
        if kind == "update":
            counted += value
        elif kind == "postfix" and value.startswith("finalising shard-"):
            index = int(value[len("finalising shard-") :][:5])
            assert counted >= 12 * (index + 1)


def test_a_rerun_of_a_finished_job_shows_the_re_hashing(
    sample_imagefolder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    argv = ["preprocess", str(sample_imagefolder), str(out), "--size", "16", "--workers", "1"]
    assert main([*argv, "-q"]) == 0
    capsys.readouterr()
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "(1 kept from an earlier run)" in captured.out
    assert "verify: 100%" in captured.err and "B/s" in captured.err


def test_a_resume_shows_the_check_of_finished_shards(
    sample_imagefolder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "o"
    original_run = engine_module.LocalEngine.run

    def crash_after_two(self: Any, tasks: Any, job: Any, advance: Any) -> Iterator[Any]:
        for count, result in enumerate(original_run(self, tasks, job, advance), start=1):
            yield result
            if count == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(engine_module.LocalEngine, "run", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=1, show_progress=False)
    monkeypatch.setattr(engine_module.LocalEngine, "run", original_run)
    capsys.readouterr()
    summary = preprocess(sample_imagefolder, out, SMALL_SHARDS, workers=1)
    assert summary.num_reused_shards == 2
    assert "check finished shards: 100%" in capsys.readouterr().err

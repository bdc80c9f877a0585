"""examples/lightning_datamodule.py: one process, 2-process DDP on CPU, mid-epoch resume."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.examples.conftest import EXAMPLES, NUM_SAMPLES, load_example, recorded, run_example

pytest.importorskip("lightning")


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("lightning_datamodule")


def test_one_process_reads_every_sample_once_per_epoch(
    example: ModuleType, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "seen.jsonl"
    example.main([str(shards), "--epochs", "2", "--batch-size", "8", "--record", str(record)])
    assert f"epoch 0: {NUM_SAMPLES} samples over 1 ranks" in capsys.readouterr().out
    seen = recorded(record)
    for epoch in (0, 1):
        assert sorted(seen[(epoch, 0)]) == list(range(NUM_SAMPLES))
    assert seen[(0, 0)] != seen[(1, 0)]  # reshuffled


def test_mid_epoch_checkpoint_resumes_where_it_stopped(
    example: ModuleType, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [str(shards), "--batch-size", "8", "--num-workers", "2"]
    checkpoints = tmp_path / "checkpoints"
    first_file, resumed_file = tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"
    example.main(
        [
            *common,
            "--max-steps",
            "5",
            "--checkpoint-every",
            "3",
            "--record",
            str(first_file),
            "--checkpoint-dir",
            str(checkpoints),
        ]
    )
    first = recorded(first_file)[(0, 0)]
    assert len(first) == 5 * 8
    capsys.readouterr()
    example.main(
        [
            *common,
            "--epochs",
            "2",
            "--resume",
            str(checkpoints / "step=3.ckpt"),
            "--record",
            str(resumed_file),
        ]
    )
    resumed = recorded(resumed_file)
    # 3 steps were checkpointed: the resumed epoch takes over at sample 24 of the same order
    assert resumed[(0, 0)][:16] == first[24:]
    assert Counter(first[:24] + resumed[(0, 0)]) == Counter(range(NUM_SAMPLES))
    assert sorted(resumed[(1, 0)]) == list(range(NUM_SAMPLES))  # the next epoch is full
    assert f"epoch 1: {NUM_SAMPLES} samples over 1 ranks" in capsys.readouterr().out


@pytest.mark.slow
def test_two_process_ddp_on_cpu_shards_once(shards: Path, tmp_path: Path) -> None:
    out = run_example(
        [
            str(EXAMPLES / "lightning_datamodule.py"),
            str(shards),
            "--devices",
            "2",
            "--strategy",
            "ddp",
            "--epochs",
            "2",
            "--batch-size",
            "8",
            "--num-workers",
            "1",
            "--record",
            "seen.jsonl",
        ],
        tmp_path,
    )
    assert f"epoch 1: {NUM_SAMPLES} samples over 2 ranks" in out
    seen = recorded(tmp_path / "seen.jsonl")
    for epoch in (0, 1):
        ranks = [seen[(epoch, 0)], seen[(epoch, 1)]]
        assert len(ranks[0]) == len(ranks[1]) == NUM_SAMPLES // 2  # not 1/4: no double sharding
        assert sorted(ranks[0] + ranks[1]) == list(range(NUM_SAMPLES))


def _fit(
    example: ModuleType,
    shards: Path,
    record: Path,
    *,
    callbacks: list[Any] | None = None,
    ckpt_path: Path | None = None,
    num_workers: int = 2,
) -> None:
    """Two epochs of the example's module, data and callbacks, as its ``main`` builds them."""
    import lightning as L  # noqa: N812, PLC0415 - imported once importorskip passed

    data = example.ShardDataModule(str(shards), batch_size=8, num_workers=num_workers)
    model = example.TinyClassifier(data.num_classes, record=str(record))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        callbacks=[example.WholeEpochAfterEpochStartCheckpoint(), *(callbacks or [])],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_checkpoint_saved_at_epoch_start_resumes_the_whole_epoch(
    example: ModuleType, shards: Path, tmp_path: Path, num_workers: int
) -> None:
    import lightning as L  # noqa: N812, PLC0415

    checkpoint = tmp_path / "epoch-start.ckpt"

    class SaveAtEpochStart(L.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == 1:
                trainer.save_checkpoint(checkpoint)

    first_file, resumed_file = tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"
    _fit(example, shards, first_file, callbacks=[SaveAtEpochStart()], num_workers=num_workers)
    first = recorded(first_file)
    _fit(example, shards, resumed_file, ckpt_path=checkpoint, num_workers=num_workers)
    resumed = recorded(resumed_file)
    assert set(resumed) == {(1, 0)}  # epoch 0 was done
    assert resumed[(1, 0)] == first[(1, 0)]  # epoch 1 whole, in the same order

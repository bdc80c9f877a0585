from __future__ import annotations

import functools
import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastdata.datasets import RAMDataset
from fastdata.datasets._loader import EpochBatch
from fastdata.datasets._shm import SharedBuffer
from fastdata.datasets.node_shared import (
    _ByDescriptor,
    _open_descriptor,
    share_on_node,
    shared_memory_usage,
)
from tests.datasets.conftest import gloo_group, write_jpegs
from tests.datasets.test_batch_decoders import BatchedCpuDecoder

IMAGES = (48, 64, 64, 3)  # 576 KiB of uint8 pixels


def _pixels() -> np.ndarray:
    return (np.arange(np.prod(IMAGES)) % 251).astype(np.uint8).reshape(IMAGES)


def _build() -> RAMDataset:
    return RAMDataset.from_arrays(_pixels(), np.arange(IMAGES[0]), layout="HWC")


def _build_broken() -> RAMDataset:
    raise OSError("disk gone")


def test_without_a_process_group_it_just_builds() -> None:
    dataset = share_on_node(_build)
    image, label = dataset[5]
    assert image.shape == IMAGES[1:] and int(label) == 5


def test_buffers_pickle_as_descriptors_of_the_same_memory() -> None:
    buffer = SharedBuffer(4096, "test")
    stream = io.BytesIO()
    _ByDescriptor(stream).dump({"buffer": buffer})
    assert len(stream.getvalue()) < 200  # a reference, not the 4 KiB
    clone = pickle.loads(stream.getvalue())["buffer"]
    assert clone.fd != buffer.fd
    buffer.array[:3] = [7, 8, 9]
    assert clone.array[:3].tolist() == [7, 8, 9]
    clone.close()
    buffer.close()
    with pytest.raises(ValueError, match="cannot share a closed SharedBuffer"):
        _ByDescriptor(io.BytesIO()).dump(buffer)


def test_unreachable_descriptor_is_explained() -> None:
    with pytest.raises(RuntimeError, match="cannot open the shared buffer of local rank"):
        _open_descriptor(os.getpid(), 10_000, 16)


def _worker(rank: int, store: str, out: str) -> None:
    with gloo_group(rank, store):
        report: dict[str, object] = {}
        for mode in ("shared", "per_rank"):
            dataset = share_on_node(_build) if mode == "shared" else _build()
            images, labels = dataset.__getitems__(list(range(IMAGES[0])))  # every page
            report[f"{mode}_equal"] = bool(
                np.array_equal(images.numpy(), _pixels()) and labels.tolist() == list(range(48))
            )
            dist.barrier()  # both ranks mapped everything before measuring
            report[mode] = shared_memory_usage()
            report[f"{mode}_nbytes"] = dataset.nbytes
            dist.barrier()
            dataset.close()
        try:
            share_on_node(_build_broken)
        except Exception as exc:  # recorded per rank
            report["failure"] = f"{type(exc).__name__}: {exc}"
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))


def test_two_ranks_hold_one_copy(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["shared_equal"] and rank["per_rank_equal"]
        nbytes = rank["shared_nbytes"]
        assert rank["per_rank"]["pss_bytes"] >= 0.95 * nbytes  # its own copy
        assert 0.4 * nbytes <= rank["shared"]["pss_bytes"] <= 0.6 * nbytes  # half of one
        assert rank["shared"]["rss_bytes"] >= 0.95 * nbytes  # while mapping all of it
    assert ranks[0]["failure"] == "OSError: disk gone"
    assert ranks[1]["failure"].startswith("RuntimeError: share_on_node failed on ranks {0:")


def _build_decoding(files: list[str]) -> RAMDataset:
    decoder = BatchedCpuDecoder(24, num_threads=1, random_crop=True, seed=5)
    return RAMDataset(files, list(range(len(files))), decode=decoder, show_progress=False)


def _decoding_worker(rank: int, store: str, files: list[str], out: str) -> None:
    with gloo_group(rank, store):
        dataset = share_on_node(functools.partial(_build_decoding, files))
        built_here = dataset.batch_decode.decoder is not None
        images, labels = dataset.__getitems__(EpochBatch(list(range(len(files))), epoch=1))
        streamed = [batch[0] for batch in dataset.loader(batch_size=4)]
        torch.save(
            {"built_here": built_here, "images": images, "labels": labels, "loader": streamed},
            Path(out, f"rank{rank}.pt"),
        )


def test_a_rank_given_a_dataset_with_a_batch_decoder_decodes_the_same_crops(
    tmp_path: Path,
) -> None:
    files = [str(path) for path in write_jpegs(tmp_path / "files", 10, 48, 64)]
    args = (str(tmp_path / "store"), files, str(tmp_path))
    mp.spawn(_decoding_worker, args=args, nprocs=2, join=True)
    builder, receiver = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert builder["built_here"] and not receiver["built_here"]  # it had only the recipe
    here = _build_decoding(files)  # the same crops as one made in this process
    want = here.__getitems__(EpochBatch(list(range(10)), epoch=1))[0]
    want_streamed = [batch[0] for batch in here.loader(batch_size=4)]
    for rank in (builder, receiver):
        assert rank["labels"].tolist() == list(range(10))
        assert torch.equal(rank["images"], want)
        assert len(rank["loader"]) == len(want_streamed) == 3
        for got, expected in zip(rank["loader"], want_streamed, strict=True):
            assert torch.equal(got, expected)

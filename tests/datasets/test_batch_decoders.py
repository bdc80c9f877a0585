"""A dataset's ``decode=`` given a decoder that runs on whole batches in the training
process (``dali``, ``nvjpeg``, a device output): the same batches as
:class:`~fastdata.decode.DecodingLoader` over the encoded bytes, in the calling process or
after the workers of ``dataset.loader(...)``, with the dataset's ``on_error`` and an exact
mid-epoch resume.

The same tests run with DALI's CPU pipeline (``dali``), nvJPEG and DALI on a GPU
(``gpu``), and on every machine a ``"cpu"`` decoder under another backend name, which
takes the same whole-batch path without DALI or a GPU.
"""

from __future__ import annotations

import gc
import pickle
import re
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata import RAMDataset, ShardDataset
from fastdata.datasets import ResumableDataLoader, ShardAwareDistributedSampler
from fastdata.datasets._loader import EpochBatch
from fastdata.decode import Decoder, DecodingLoader, create_decoder
from fastdata.decode.cpu import CpuDecoder
from fastdata.errors import DecodeError, OnError
from fastdata.shards import FieldSpec
from fastdata.transforms import RandomHorizontalFlip
from tests.datasets.conftest import write_jpegs, write_shards

COUNT = 14
SIZE = (24, 20)  # the decoders' output (H, W)
BAD = 5  # the sample whose bytes do not decode, in the sets with a bad sample
FIELDS = [
    FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
    FieldSpec("label", "array", "int64"),
]


class BatchedCpuDecoder(CpuDecoder):
    """The ``cpu`` decoder under another backend name: a dataset runs it on whole batches
    in the training process, as it runs ``dali`` and ``nvjpeg``."""

    backend = "batched-cpu"


def _batched_cpu(**settings: Any) -> Decoder:
    return BatchedCpuDecoder(SIZE, num_threads=1, **settings)


def _dali(**settings: Any) -> Decoder:
    return create_decoder("dali", size=SIZE, device="cpu", num_threads=1, **settings)


def _nvjpeg(**settings: Any) -> Decoder:
    return create_decoder("nvjpeg", size=SIZE, device="cuda", **settings)


def _dali_on_gpu(**settings: Any) -> Decoder:
    return create_decoder("dali", size=SIZE, device="cuda", num_threads=1, **settings)


DECODERS = [
    pytest.param(_batched_cpu, id="batched-cpu"),
    pytest.param(_dali, id="dali-cpu", marks=pytest.mark.dali),
    pytest.param(_nvjpeg, id="nvjpeg", marks=pytest.mark.gpu),
    pytest.param(_dali_on_gpu, id="dali-gpu", marks=[pytest.mark.dali, pytest.mark.gpu]),
]
Make = Callable[..., Decoder]


@pytest.fixture
def jpeg_files(tmp_path: Path) -> list[Path]:
    return write_jpegs(tmp_path / "files", COUNT, 64, 80)


@pytest.fixture
def with_bad_file(jpeg_files: list[Path]) -> list[Path]:
    jpeg_files[BAD].write_bytes(jpeg_files[BAD].read_bytes()[:40])  # truncated
    return jpeg_files


def _shards(root: Path, paths: list[Path]) -> Path:
    samples = [{"image": path.read_bytes(), "label": 100 + i} for i, path in enumerate(paths)]
    return write_shards(root, FIELDS, samples)


def _cpu(batch: tuple[Any, ...]) -> list[Any]:
    return [value.cpu() if isinstance(value, torch.Tensor) else value for value in batch]


def _assert_same_batches(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for got_batch, want_batch in zip(got, want, strict=True):
        for got_value, want_value in zip(_cpu(got_batch), _cpu(want_batch), strict=True):
            assert torch.equal(got_value, want_value)


def _labels(batches: list[Any]) -> list[int]:
    return [int(label) for batch in batches for label in batch[1].cpu()]


@pytest.mark.parametrize("make", DECODERS)
def test_a_shard_dataset_decodes_as_decoding_loader_does(
    tmp_path: Path, with_bad_file: list[Path], make: Make
) -> None:
    root = _shards(tmp_path / "shards", with_bad_file)
    decoder = make(random_crop=True, seed=3)
    dataset = ShardDataset(root, decode=decoder, on_error="skip")
    got = list(dataset.loader(batch_size=4))
    encoded = ShardDataset(root, decode=False).loader(batch_size=4)
    reference = make(random_crop=True, seed=3, on_error="skip")
    want = list(DecodingLoader(encoded, reference))
    _assert_same_batches(got, want)
    assert _labels(got) == [100 + i for i in range(COUNT) if i != BAD]
    images = got[0][0]
    assert images.shape == (4, 3, *SIZE) and images.dtype == torch.uint8
    assert images.device == decoder.device
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert got[1][0].shape[0] == 3  # the bad sample left its batch, its label with it


@pytest.mark.parametrize("make", DECODERS)
def test_a_ram_dataset_of_files_decodes_in_the_calling_process(
    jpeg_files: list[Path], make: Make
) -> None:
    labels = list(range(COUNT))
    dataset = RAMDataset(jpeg_files, labels, decode=make(seed=1), show_progress=False)
    images, got_labels = dataset.__getitems__([0, 7, 2])
    assert got_labels.tolist() == [0, 7, 2]
    want = make(seed=1)([jpeg_files[i].read_bytes() for i in (0, 7, 2)])
    assert torch.equal(images.cpu(), want.cpu())
    image, label = dataset[7]
    assert torch.equal(image.cpu(), want[1].cpu()) and int(label) == 7
    bare = RAMDataset(jpeg_files, None, decode=make(seed=1), layout="HWC", show_progress=False)
    only = bare.__getitems__([0, 7, 2])  # one field: the bare batch, in the layout asked
    assert isinstance(only, torch.Tensor) and only.shape == (3, *SIZE, 3)
    assert torch.equal(only.cpu(), want.permute(0, 2, 3, 1).cpu())


@pytest.mark.parametrize("make", DECODERS)
def test_workers_read_the_bytes_and_the_loader_decodes_the_same_batches(
    tmp_path: Path, with_bad_file: list[Path], make: Make
) -> None:
    root = _shards(tmp_path / "shards", with_bad_file)

    def epoch(num_workers: int) -> list[Any]:
        dataset = ShardDataset(root, decode=make(random_crop=True, seed=5), on_error="skip")
        generator = torch.Generator().manual_seed(0)
        loader = dataset.loader(
            batch_size=4, shuffle=True, generator=generator, num_workers=num_workers
        )
        return list(loader)

    in_process = epoch(0)
    assert sorted(_labels(in_process)) == [100 + i for i in range(COUNT) if i != BAD]
    _assert_same_batches(epoch(2), in_process)


def test_a_plain_dataloader_with_workers_is_refused_in_one_line(
    jpeg_files: list[Path],
) -> None:
    dataset = RAMDataset(jpeg_files, list(range(COUNT)), decode=_batched_cpu(), show_progress=False)
    plain = DataLoader(dataset, batch_size=4, num_workers=1)
    with pytest.raises(
        RuntimeError, match=r"decodes in the training process, not in DataLoader"
    ) as caught:
        next(iter(plain))
    message = str(caught.value).splitlines()
    assert any(
        line.startswith("RuntimeError: decode=<'batched-cpu' decoder on 'cpu'>") for line in message
    )
    assert len(list(DataLoader(dataset, batch_size=4))) == 4  # no workers: decoded here


@pytest.mark.parametrize("make", DECODERS)
def test_bad_bytes_follow_the_datasets_on_error(with_bad_file: list[Path], make: Make) -> None:
    labels = list(range(COUNT))
    # the decoder's own on_error is not the one that applies: the dataset's is
    raising = RAMDataset(with_bad_file, labels, decode=make(on_error="skip"), show_progress=False)
    with pytest.raises(DecodeError, match=rf"dataset\[{BAD}\], .*{BAD:03d}\.jpg"):
        raising.__getitems__([4, BAD, 6])
    with pytest.raises(DecodeError, match=rf"dataset\[{BAD}\]"):
        list(raising.loader(batch_size=4))
    skipping = RAMDataset(
        with_bad_file, labels, decode=make(), on_error="skip", show_progress=False
    )
    images, kept = skipping.__getitems__([4, BAD, 6])
    assert kept.tolist() == [4, 6] and images.shape[0] == 2
    with pytest.raises(DecodeError):  # a single read has no batch to leave the sample out of
        skipping[BAD]
    warning = RAMDataset(with_bad_file, labels, decode=make(), on_error="warn", show_progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(warning.loader(batch_size=4, num_workers=2))
    messages = [str(w.message) for w in caught if "skipped a sample" in str(w.message)]
    assert len(messages) == 1 and re.search(rf"dataset\[{BAD}\], .*{BAD:03d}\.jpg", messages[0])
    assert _labels(batches) == [i for i in range(COUNT) if i != BAD]


def test_the_datasets_on_error_holds_while_the_loader_streams(jpeg_files: list[Path]) -> None:
    # A backend may decode the next batch on a thread of its own while the loop uses this
    # one (nvJPEG): the dataset's policy is the decoder's for the whole stream, not only
    # while a batch is asked for; the decoder's own comes back when the stream ends.
    decoder = _batched_cpu(on_error="raise")
    dataset = RAMDataset(
        jpeg_files, list(range(COUNT)), decode=decoder, on_error="skip", show_progress=False
    )
    seen = [decoder.on_error for _ in dataset.loader(batch_size=4)]
    assert seen == [OnError.SKIP] * 4
    assert decoder.on_error is OnError.RAISE and not decoder.keep_damaged
    stream = iter(dataset.loader(batch_size=4))
    next(stream)
    assert decoder.on_error is OnError.SKIP
    del stream  # left early: the decoder's own policy comes back
    gc.collect()
    assert decoder.on_error is OnError.RAISE


def _resumable(
    root: Path, make: Make, num_workers: int, batch_size: int = 4
) -> ResumableDataLoader:
    dataset = ShardDataset(root, decode=make(random_crop=True, seed=2), on_error="skip")
    sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=4)
    return dataset.loader(batch_size=batch_size, sampler=sampler, num_workers=num_workers)


def _crops_by_label(batches: list[Any]) -> dict[int, torch.Tensor]:
    """Each sample's decoded image, by its label."""
    return {
        int(label): image
        for batch in batches
        for image, label in zip(batch[0].cpu(), batch[1].cpu(), strict=True)
    }


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("make", DECODERS)
def test_state_dict_resumes_exactly_without_the_batch_read_ahead(
    tmp_path: Path, with_bad_file: list[Path], make: Make, num_workers: int
) -> None:
    root = _shards(tmp_path / "shards", with_bad_file)
    whole = list(_resumable(root, make, num_workers))
    assert sorted(_labels(whole)) == [100 + i for i in range(COUNT) if i != BAD]
    first = _resumable(root, make, num_workers)
    batches = iter(first)
    head = [next(batches) for _ in range(2)]
    state = first.state_dict()
    assert (state["sampler"]["num_consumed"], state["num_batches"]) == (8, 2)
    assert first.sampler.state_dict() == state["sampler"]  # the sampler agrees
    del batches

    # A new decoder, whose stream starts afresh: the random crops are drawn per sample
    # from (seed, epoch, index), as the CPU transforms draw, so the resumed run gets the
    # uninterrupted run's images, crops included.
    resumed = _resumable(root, make, num_workers)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    _assert_same_batches(head + list(resumed), whole)
    # the next epoch draws other crops of the same samples
    loader = _resumable(root, make, num_workers)
    loader.sampler.set_epoch(1)
    first_epoch, second_epoch = _crops_by_label(whole), _crops_by_label(list(loader))
    assert first_epoch.keys() == second_epoch.keys()
    assert any(not torch.equal(first_epoch[k], second_epoch[k]) for k in first_epoch)


@pytest.mark.parametrize("make", DECODERS)
def test_a_copy_in_another_process_reads_bytes_and_makes_its_own_decoder_to_decode(
    jpeg_files: list[Path], make: Make
) -> None:
    dataset = RAMDataset(
        jpeg_files, list(range(COUNT)), decode=make(random_crop=True, seed=3), show_progress=False
    )
    dataset.__getitems__([0, 1])  # the decoder's threads, pipelines are made
    copy = pickle.loads(pickle.dumps(dataset))  # as spawned workers, other ranks receive it
    assert copy.options.decode is True and dataset.options.decode is dataset.batch_decode.decoder
    assert copy.batch_decode.decoder is None  # not made where it only reads bytes
    encoded = EpochBatch([0, 1], epoch=0, encoded=True)  # what dataset.loader(...) asks
    blobs, labels = copy.__getitems__(encoded)
    assert [bytes(blob.numpy()) for blob in blobs] == [jpeg_files[i].read_bytes() for i in (0, 1)]
    assert labels.tolist() == [0, 1]
    assert copy.batch_decode.decoder is None
    # Asked to decode, the copy makes its decoder from the original's recipe: the same
    # crops of the same (seed, epoch, index) keys.
    keyed = EpochBatch([3, 1, 4], epoch=2)
    images, labels = copy.__getitems__(keyed)
    made = copy.batch_decode.decoder
    assert type(made) is type(dataset.batch_decode.decoder) and made._random.seed == 3
    assert torch.equal(images.cpu(), dataset.__getitems__(keyed)[0].cpu())
    assert labels.tolist() == [3, 1, 4]
    spawned = dataset.loader(batch_size=2, num_workers=1, multiprocessing_context="spawn")
    first = dataset.__getitems__(EpochBatch([0, 1], epoch=0))[0]
    assert torch.equal(next(iter(spawned))[0].cpu(), first.cpu())


def test_a_copy_whose_decoder_arguments_do_not_pickle_says_so(jpeg_files: list[Path]) -> None:
    class LocalDecoder(BatchedCpuDecoder):  # a class pickle cannot name
        pass

    dataset = RAMDataset(
        jpeg_files, list(range(COUNT)), decode=LocalDecoder(SIZE), show_progress=False
    )
    copy = pickle.loads(pickle.dumps(dataset))  # the dataset still travels, to read bytes
    blobs, _ = copy.__getitems__(EpochBatch([0], epoch=0, encoded=True))
    assert bytes(blobs[0].numpy()) == jpeg_files[0].read_bytes()
    with pytest.raises(
        RuntimeError, match=r"stayed in the process .*; its arguments do not pickle"
    ):
        copy.__getitems__([0])


@pytest.mark.parametrize("make", DECODERS)
def test_a_loop_left_early_lets_its_workers_go_and_keeps_the_read_ahead_out(
    tmp_path: Path, jpeg_files: list[Path], make: Make
) -> None:
    root = _shards(tmp_path / "shards", jpeg_files)
    loader = _resumable(root, make, num_workers=1)
    batches = iter(loader)
    head = _labels([next(batches)])
    workers = weakref.ref(batches._handing._inner)  # the DataLoader's worker iterator
    del batches
    assert workers() is None  # the loader keeps no hold on it: its workers end
    state = loader.state_dict()
    assert (state["sampler"]["num_consumed"], state["num_batches"]) == (4, 1)
    whole = _labels(list(_resumable(root, make, num_workers=0)))
    resumed = _resumable(root, make, num_workers=0)
    resumed.load_state_dict(state)
    assert head + _labels(list(resumed)) == whole


def test_what_a_batch_decoder_cannot_follow_is_refused(
    tmp_path: Path, jpeg_files: list[Path]
) -> None:
    labels = list(range(COUNT))
    with pytest.raises(ValueError, match=r"transform=.* with decode=<'batched-cpu' decoder"):
        RAMDataset(
            jpeg_files, labels, RandomHorizontalFlip(), decode=_batched_cpu(), show_progress=False
        )
    with pytest.raises(ValueError, match="decode_min_side=32 applies to decode=True only"):
        RAMDataset(
            jpeg_files, labels, decode=_batched_cpu(), decode_min_side=32, show_progress=False
        )
    fields = [*FIELDS, FieldSpec("mask", "array", "uint8", (8, 8), "HW")]
    samples = [
        {"image": path.read_bytes(), "label": i, "mask": np.zeros((8, 8), np.uint8)}
        for i, path in enumerate(jpeg_files)
    ]
    root = write_shards(tmp_path / "masked", fields, samples)
    with pytest.raises(ValueError, match=r"field 'mask' \(role 'mask'\) would not follow"):
        ShardDataset(root, fields=("image", "label", "mask"), decode=_batched_cpu())
    with pytest.raises(
        ValueError, match=r"decodes one encoded image field, but fields \('label',\)"
    ):
        ShardDataset(root, fields=("label",), decode=_batched_cpu())
    dataset = ShardDataset(root, fields=("image", "label"), decode=_batched_cpu())
    with pytest.raises(ValueError, match="batch_size=None: the decoder given as decode="):
        dataset.loader(batch_size=None)


@pytest.mark.gpu
def test_a_cpu_decoder_to_cuda_decodes_in_the_training_process(jpeg_files: list[Path]) -> None:
    decoder = create_decoder("cpu", size=SIZE, device="cuda", num_threads=1, seed=1)
    dataset = RAMDataset(jpeg_files, list(range(COUNT)), decode=decoder, show_progress=False)
    batches = list(dataset.loader(batch_size=4, num_workers=2))
    want = create_decoder("cpu", size=SIZE, num_threads=1, seed=1)
    assert batches[0][0].device.type == "cuda"
    assert torch.equal(batches[0][0].cpu(), want([p.read_bytes() for p in jpeg_files[:4]]))


@pytest.mark.parametrize("make", DECODERS)
def test_crops_follow_the_sample_not_the_batching_or_the_executor(
    tmp_path: Path, jpeg_files: list[Path], make: Make
) -> None:
    root = _shards(tmp_path / "shards", jpeg_files)
    by_four = _crops_by_label(list(_resumable(root, make, num_workers=0)))
    by_three = _crops_by_label(list(_resumable(root, make, num_workers=2, batch_size=3)))
    assert by_four.keys() == by_three.keys() == {100 + i for i in range(COUNT)}
    decoder = make(random_crop=True, seed=2)
    # the same boxes; on a GPU the batched resize may round a level apart in another batch
    # (its matmuls sum over regions padded to the batch's largest), another box far more
    tolerance = 0 if decoder.device.type == "cpu" else 1
    for label, image in by_four.items():
        difference = (image.int() - by_three[label].int()).abs().max()
        assert int(difference) <= tolerance, label
    # the same boxes as the "cpu" decoder run per sample by the dataset (in its workers)
    if decoder.backend == "batched-cpu":  # same pixels too: the same decode and resize
        per_sample = _crops_by_label(list(_resumable(root, _per_sample_cpu, num_workers=2)))
        for label, image in by_four.items():
            assert torch.equal(image, per_sample[label]), label


def _per_sample_cpu(**settings: Any) -> Decoder:
    return create_decoder("cpu", size=SIZE, num_threads=1, **settings)


def test_decoding_loader_in_this_process_resumes_with_the_same_crops(
    tmp_path: Path, jpeg_files: list[Path]
) -> None:
    root = _shards(tmp_path / "shards", jpeg_files)

    def loader() -> DecodingLoader:
        dataset = ShardDataset(root, decode=False)
        sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=4)
        encoded = dataset.loader(batch_size=4, sampler=sampler, num_workers=1)
        decoder = _per_sample_cpu(random_crop=True, seed=2)
        return DecodingLoader(encoded, decoder, decode_in_workers=False)

    whole = list(loader())
    first = loader()
    batches = iter(first)
    head = [next(batches) for _ in range(2)]
    state = first.state_dict()
    del batches
    resumed = loader()
    resumed.load_state_dict(state)
    _assert_same_batches(head + list(resumed), whole)
    # and the crops of the dataset that decodes with that decoder itself
    dataset_crops = _crops_by_label(list(_resumable(root, _batched_cpu, num_workers=0)))
    for label, image in _crops_by_label(whole).items():
        assert torch.equal(image, dataset_crops[label]), label

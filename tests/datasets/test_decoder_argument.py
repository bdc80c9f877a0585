"""A dataset's ``decode=`` given a :class:`~fastdata.decode.Decoder`: the decoder's
geometry decodes each image, in the calling process and in workers; anything else that is
not a bool is refused."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata import RAMDataset, ShardDataset
from fastdata.decode import Decoder, create_decoder
from fastdata.errors import DecodeError
from fastdata.shards import FieldSpec
from fastdata.transforms import RandomHorizontalFlip
from tests.datasets.conftest import write_jpegs, write_shards

COUNT = 22
SIZE = (24, 20)  # the decoders' output (H, W)


@pytest.fixture
def jpeg_files(tmp_path: Path) -> list[Path]:
    """JPEG files of several sizes, large enough for reduced (DCT-scaled) decoding."""
    return write_jpegs(tmp_path, COUNT, 96, 128)


def _batch(dataset: Any, indices: list[int]) -> np.ndarray:
    images = dataset.__getitems__(indices)[0]
    return np.ascontiguousarray(images.permute(0, 2, 3, 1).numpy())  # (B, H, W, C)


def _decoder_output(decoder: Decoder, paths: list[Path]) -> np.ndarray:
    images = decoder([path.read_bytes() for path in paths])
    return images.permute(0, 2, 3, 1).numpy()


def test_a_cpu_decoder_decodes_each_file_into_its_centred_output(
    jpeg_files: list[Path],
) -> None:
    decoder = create_decoder("cpu", size=SIZE, num_threads=1)
    dataset = RAMDataset(jpeg_files, list(range(COUNT)), decode=decoder, show_progress=False)
    images, labels = dataset.__getitems__([0, 4, 5])
    assert images.shape == (3, 3, *SIZE) and labels.tolist() == [0, 4, 5]
    expected = _decoder_output(decoder, [jpeg_files[i] for i in (0, 4, 5)])
    np.testing.assert_array_equal(_batch(dataset, [0, 4, 5]), expected)
    assert tuple(dataset[1][0].shape) == (3, *SIZE)


def test_a_dataset_with_a_decoder_pickles_into_spawned_workers(jpeg_files: list[Path]) -> None:
    decoder = create_decoder("cpu", size=SIZE, num_threads=1)  # its threads do not pickle
    dataset = RAMDataset(jpeg_files, list(range(COUNT)), decode=decoder, show_progress=False)
    copy = pickle.loads(pickle.dumps(dataset))  # the decoder's geometry travels, not it
    np.testing.assert_array_equal(_batch(copy, [0, 4, 5]), _batch(dataset, [0, 4, 5]))


def test_a_grayscale_decoder_gives_one_channel(jpeg_files: list[Path]) -> None:
    decoder = create_decoder("cpu", size=SIZE, grayscale=True, num_threads=1)
    dataset = RAMDataset(jpeg_files, list(range(COUNT)), decode=decoder, show_progress=False)
    np.testing.assert_array_equal(_batch(dataset, [2]), _decoder_output(decoder, [jpeg_files[2]]))
    assert dataset.__getitems__([2])[0].shape == (1, 1, *SIZE)


def _epoch(dataset: RAMDataset, **settings: Any) -> np.ndarray:
    loader = dataset.loader(batch_size=4, **settings)
    return np.concatenate([batch[0].numpy() for batch in loader])


def test_seeded_random_crops_are_the_same_in_workers_and_differ_per_epoch(
    jpeg_files: list[Path],
) -> None:
    def dataset() -> RAMDataset:
        decoder = create_decoder("cpu", size=SIZE, random_crop=True, seed=7, num_threads=1)
        flip = RandomHorizontalFlip(seed=2)  # the transform runs on the decoded crops
        return RAMDataset(jpeg_files, list(range(COUNT)), flip, decode=decoder, show_progress=False)

    in_process = dataset().loader(batch_size=4)
    first, second = (np.concatenate([b[0].numpy() for b in in_process]) for _ in range(2))
    assert first.shape == (COUNT, 3, *SIZE)
    assert not np.array_equal(first, second)  # a new epoch, new crops
    workers = _epoch(dataset(), num_workers=2)
    np.testing.assert_array_equal(workers, first)  # the same seed and epoch: the same crops
    centred = _decoder_output(create_decoder("cpu", size=SIZE), jpeg_files)
    assert not np.array_equal(first, centred.transpose(0, 3, 1, 2))


def test_bad_bytes_follow_the_datasets_on_error(jpeg_files: list[Path]) -> None:
    jpeg_files[3].write_bytes(b"\xff\xd8 not a jpeg")
    decoder = create_decoder("cpu", size=SIZE, num_threads=1)
    skipping = RAMDataset(
        jpeg_files, list(range(COUNT)), decode=decoder, on_error="skip", show_progress=False
    )
    assert skipping.__getitems__([2, 3, 4])[1].tolist() == [2, 4]
    raising = RAMDataset(jpeg_files, list(range(COUNT)), decode=decoder, show_progress=False)
    with pytest.raises(DecodeError, match=r"dataset\[3\]"):
        raising.__getitems__([2, 3, 4])


def test_a_shard_dataset_decodes_jpeg_shards_with_the_decoder(
    tmp_path: Path, jpeg_files: list[Path]
) -> None:
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
        FieldSpec("label", "array", "int64"),
    ]
    samples = [{"image": path.read_bytes(), "label": i} for i, path in enumerate(jpeg_files)]
    root = write_shards(tmp_path / "shards", fields, samples)
    decoder = create_decoder("cpu", size=SIZE, num_threads=1)
    dataset = ShardDataset(root, decode=decoder, num_threads=2)
    expected = _decoder_output(decoder, [jpeg_files[i] for i in (1, 9, 20)])
    np.testing.assert_array_equal(_batch(dataset, [1, 9, 20]), expected)


@pytest.mark.parametrize("decode", ["yes", 1, None, object()])
def test_anything_but_a_bool_or_a_decoder_is_refused(
    jpeg_files: list[Path], decode: object
) -> None:
    with pytest.raises(TypeError, match=r"decode must be True, False or a fastdata\.decode"):
        RAMDataset(jpeg_files, None, decode=decode, show_progress=False)  # type: ignore[arg-type]


def test_decode_min_side_is_refused_with_a_decoder(jpeg_files: list[Path]) -> None:
    with pytest.raises(ValueError, match="decode_min_side=64 applies to decode=True only"):
        RAMDataset(
            jpeg_files,
            None,
            decode=create_decoder("cpu", size=SIZE, num_threads=1),
            decode_min_side=64,
            show_progress=False,
        )


def test_other_backends_and_device_outputs_decode_whole_batches(jpeg_files: list[Path]) -> None:
    # (decoded in the training process: see test_batch_decoders.py)
    to_cuda = create_decoder("cpu", size=SIZE, device="cuda", num_threads=1)
    dataset = RAMDataset(jpeg_files, None, decode=to_cuda, show_progress=False)
    assert dataset.batch_decode is not None and dataset.crop_decode is None
    on_cpu = RAMDataset(
        jpeg_files,
        None,
        decode=create_decoder("cpu", size=SIZE, num_threads=1),
        show_progress=False,
    )
    assert on_cpu.batch_decode is None and on_cpu.crop_decode is not None

"""ShardDataset specifics: fields, layouts, encoded mode, errors, threads, transforms."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import RAMDataset, ShardDataset, _buffers, passthrough_collate
from fastdata.errors import DecodeError, OnError
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import CenterCrop
from tests.datasets.conftest import NUM_SAMPLES, SIZE, Reference, write_shards
from tests.decode.conftest import damaged_jpeg


def test_masks_labels_and_hwc_layout(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "mask", "label"), layout="HWC")
    images, masks, labels = dataset.__getitems__([4, 12])
    np.testing.assert_array_equal(images.numpy(), raw_shards.images[[4, 12]])
    np.testing.assert_array_equal(masks.numpy(), raw_shards.masks[[4, 12]])
    assert masks.dtype == torch.uint8 and labels.dtype == torch.int64
    assert dataset.class_names == list("abcde")


def test_chw_batch_is_a_channels_last_view(raw_shards: Reference) -> None:
    images = ShardDataset(raw_shards.path, fields=("image",)).__getitems__([1, 2])
    assert images.shape == (2, 3, 12, 10)
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_threads_give_the_same_batch(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, num_threads=3)
    assert dataset.num_threads == 3
    indices = list(range(NUM_SAMPLES))[::-1]
    threaded = dataset.__getitems__(indices)
    dataset.num_threads = 1
    single = dataset.__getitems__(indices)
    for a, b in zip(threaded, single, strict=True):
        assert torch.equal(a, b)


def test_unknown_field_and_bad_arguments(raw_shards: Reference) -> None:
    with pytest.raises(ValueError, match=r"fields \['depth'\] are not in the shard set"):
        ShardDataset(raw_shards.path, fields=("image", "depth"))
    with pytest.raises(ValueError, match="fields must be a non-empty sequence"):
        ShardDataset(raw_shards.path, fields="image")
    with pytest.raises(ValueError, match=r"layout must be one of \('CHW', 'HWC'\), got 'NCHW'"):
        ShardDataset(raw_shards.path, layout="NCHW")
    with pytest.raises(ValueError, match="on_error must be one of"):
        ShardDataset(raw_shards.path, on_error="ignore")
    with pytest.raises(ValueError, match="num_threads must be a positive int or None, got 0"):
        ShardDataset(raw_shards.path, num_threads=0)
    with pytest.raises(TypeError, match="transform must be callable or None, got int"):
        ShardDataset(raw_shards.path, transform=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decode_min_side must be a positive int"):
        ShardDataset(raw_shards.path, decode_min_side=-2)


def test_encoded_mode_returns_bytes_for_gpu_decoding(encoded_shards: Reference) -> None:
    dataset = ShardDataset(encoded_shards.path, decode=False)
    loader = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=passthrough_collate)
    encoded, labels = next(iter(loader))
    assert isinstance(encoded, list) and len(encoded) == 8
    assert all(t.dtype == torch.uint8 and t.dim() == 1 for t in encoded)
    assert [bytes(t.numpy()) for t in encoded] == encoded_shards.jpegs[:8]
    np.testing.assert_array_equal(labels.numpy(), encoded_shards.labels[:8])


def test_per_sample_torchvision_style_transform(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, transform=lambda image: image.flip(-1).float())
    images, _ = dataset.__getitems__([0, 5])
    expected = raw_shards.images[[0, 5]][:, :, ::-1].transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(images.numpy(), expected.astype(np.float32))
    single, _ = dataset[5]
    np.testing.assert_array_equal(single.numpy(), expected[1])


def test_batch_transform_on_encoded_images(encoded_shards: Reference) -> None:
    dataset = ShardDataset(encoded_shards.path, transform=CenterCrop((6, 4)))
    images, _ = dataset.__getitems__([2, 3])
    np.testing.assert_array_equal(_hwc(images), encoded_shards.images[[2, 3], 3:9, 3:7])


def _hwc(batch: torch.Tensor) -> np.ndarray:
    return batch.permute(0, 2, 3, 1).numpy()


@pytest.fixture
def corrupt_shards(encoded_shards: Reference) -> Reference:
    """The encoded set with sample 5 replaced by bytes that do not decode."""
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
        FieldSpec("label", "array", "int64"),
    ]
    samples = [
        {
            "image": b"\xff\xd8 not a jpeg" if i == 5 else data,
            "label": int(encoded_shards.labels[i]),
        }
        for i, data in enumerate(encoded_shards.jpegs)
    ]
    encoded_shards.path = write_shards(encoded_shards.path.parent / "corrupt", fields, samples)
    return encoded_shards


def test_on_error_policies(corrupt_shards: Reference) -> None:
    indices = [4, 5, 6]
    with pytest.raises(DecodeError, match=r"not a decodable image .*shard-00000.h5:5"):
        ShardDataset(corrupt_shards.path).__getitems__(indices)
    images, labels = ShardDataset(corrupt_shards.path, on_error="skip").__getitems__(indices)
    np.testing.assert_array_equal(_hwc(images), corrupt_shards.images[[4, 6]])
    np.testing.assert_array_equal(labels.numpy(), corrupt_shards.labels[[4, 6]])
    with pytest.warns(RuntimeWarning, match="skipped a sample: not a decodable image"):
        images, _ = ShardDataset(corrupt_shards.path, on_error="warn").__getitems__(indices)
    assert images.shape[0] == 2
    with pytest.raises(DecodeError, match=r"shard-00000\.h5:5"):
        ShardDataset(corrupt_shards.path, on_error="skip")[5]  # nothing to drop it from


@pytest.fixture
def damaged_shards(encoded_shards: Reference) -> Reference:
    """The encoded set with sample 5 a JPEG whose entropy-coded data is damaged (libjpeg
    decodes it with a warning)."""
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
        FieldSpec("label", "array", "int64"),
    ]
    samples = [
        {"image": damaged_jpeg(*SIZE) if i == 5 else data, "label": int(encoded_shards.labels[i])}
        for i, data in enumerate(encoded_shards.jpegs)
    ]
    encoded_shards.path = write_shards(encoded_shards.path.parent / "damaged", fields, samples)
    return encoded_shards


def test_a_damaged_jpeg_is_an_error_or_left_out_or_kept_with_a_warning(
    damaged_shards: Reference, tmp_path: Path
) -> None:
    indices = [4, 5, 6]
    where = r"dataset\[5\], .*shard-00000\.h5:5$"
    with pytest.raises(DecodeError, match=rf"Corrupt JPEG data: .*: {where}"):
        ShardDataset(damaged_shards.path).__getitems__(indices)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "skip" is quiet
        _, labels = ShardDataset(damaged_shards.path, on_error="skip").__getitems__(indices)
    np.testing.assert_array_equal(labels.numpy(), damaged_shards.labels[[4, 6]])
    with pytest.warns(RuntimeWarning, match=rf"kept a damaged sample: .*{where}"):
        images, labels = ShardDataset(damaged_shards.path, on_error="warn").__getitems__(indices)
    np.testing.assert_array_equal(labels.numpy(), damaged_shards.labels[indices])
    np.testing.assert_array_equal(_hwc(images)[[0, 2]], damaged_shards.images[[4, 6]])
    paths = []
    for i, data in enumerate([damaged_shards.jpegs[4], damaged_jpeg(*SIZE)]):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(data)
    files = RAMDataset(paths, [0, 1], show_progress=False)
    with pytest.raises(DecodeError, match=r"Corrupt JPEG data: .*: dataset\[1\], .*1\.jpg$"):
        files.__getitems__([0, 1])


def test_on_error_takes_the_policy_type_and_every_spelling(corrupt_shards: Reference) -> None:
    indices = [4, 5, 6]
    for policy in ("raise", OnError.RAISE):
        with pytest.raises(DecodeError) as caught:
            ShardDataset(corrupt_shards.path, on_error=policy).__getitems__(indices)
        # the decoder's error, told where the sample is stored, keeps its reason
        assert caught.value.source.endswith("shard-00000.h5:5")
        assert caught.value.reason == "truncated"  # a JPEG start without its end
        assert caught.value.message.startswith("not a decodable image")
    for policy in ("skip", OnError.SKIP, "warn", OnError.WARN):
        with warnings.catch_warnings(record=True) as caught_warnings:
            warnings.simplefilter("always")
            dataset = ShardDataset(corrupt_shards.path, on_error=policy)
            _, labels = dataset.__getitems__(indices)
        np.testing.assert_array_equal(labels.numpy(), corrupt_shards.labels[[4, 6]])
        assert dataset.on_error is OnError.parse(policy)
        assert len(caught_warnings) == (dataset.on_error is OnError.WARN)


def test_compressed_shards_read_through_hdf5(raw_shards: Reference) -> None:
    root = raw_shards.path.parent / "gzip"
    root.mkdir()
    fields = [
        FieldSpec("image", "array", "uint8", (12, 10, 3), "HWC"),
        FieldSpec("label", "array", "int64"),
    ]
    with ShardWriter(root / "shard-00000.h5", fields, compression="gzip") as writer:
        for image, label in zip(raw_shards.images, raw_shards.labels, strict=True):
            writer.append({"image": image, "label": int(label)})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    images, labels = ShardDataset(root).__getitems__([7, 2, 7])
    np.testing.assert_array_equal(_hwc(images), raw_shards.images[[7, 2, 7]])
    np.testing.assert_array_equal(labels.numpy(), raw_shards.labels[[7, 2, 7]])


def test_worker_batches_are_allocated_in_shared_memory(
    raw_shards: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_buffers, "_SHARED_MIN_BYTES", 0)  # forked workers inherit the patch
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"))
    loader = DataLoader(
        dataset, batch_size=4, num_workers=2, collate_fn=passthrough_collate, drop_last=True
    )
    for step, (images, labels, masks) in enumerate(loader):
        rows = slice(4 * step, 4 * step + 4)
        np.testing.assert_array_equal(_hwc(images), raw_shards.images[rows])
        np.testing.assert_array_equal(masks.numpy(), raw_shards.masks[rows])
        np.testing.assert_array_equal(labels.numpy(), raw_shards.labels[rows])


def test_worker_batch_buffers_start_in_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_buffers, "get_worker_info", object)  # non-None: as inside a worker
    buffers = _buffers.BatchBuffers()
    labels = buffers.empty((4, 20000), torch.int64, returned=True)
    assert labels.shape == (4, 20000) and labels.dtype == torch.int64
    assert labels.untyped_storage().is_shared()
    assert not buffers.empty((4,), torch.int64, returned=True).is_shared()  # small: plain
    # A batch that only a transform reads never leaves the worker: plain memory.
    assert not buffers.empty((4, 20000), torch.int64, returned=False).is_shared()


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int16"])
def test_integer_labels_of_any_width_come_back_as_int64(tmp_path: Path, dtype: str) -> None:
    """Labels stored narrower than int64 (shards written by hand, arrays given to
    from_arrays) are read as int64, as the docstrings promise."""
    images = np.arange(6 * 4 * 4 * 3, dtype=np.uint8).reshape(6, 4, 4, 3)
    labels = np.array([3, 0, 2, 1, 2, 0], dtype=dtype)
    fields = [
        FieldSpec("image", "array", "uint8", (4, 4, 3), "HWC"),
        FieldSpec("label", "array", dtype),
    ]
    root = tmp_path / "narrow"
    root.mkdir()
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for image, label in zip(images, labels, strict=True):
            writer.append({"image": image, "label": label})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    for dataset in (
        ShardDataset(root),
        RAMDataset.from_shards(root, show_progress=False),
        RAMDataset.from_arrays(images, labels),
    ):
        batch, got = dataset.__getitems__([5, 0, 3])
        assert got.dtype == torch.int64 and got.tolist() == [0, 3, 1]
        assert dataset[2][1].dtype == torch.int64 and int(dataset[2][1]) == 2
        np.testing.assert_array_equal(batch.permute(0, 2, 3, 1).numpy(), images[[5, 0, 3]])

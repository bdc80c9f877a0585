"""DecodingLoader on DataLoader batches shaped like ShardDataset(decode=False) gives them:
``(list of 1-D uint8 tensors, int64 labels)`` through a pass-through collate."""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastdata.datasets import ResumableDataLoader, ShardAwareDistributedSampler, ShardDataset
from fastdata.decode import DecodedBatch, DecodingLoader, create_decoder
from fastdata.decode.cpu import CpuDecoder
from fastdata.errors import DecodeError
from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, save_manifest
from tests.decode.conftest import damaged_jpeg, rgb_jpeg

FIELDS = [
    FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
    FieldSpec("label", "array", "int64"),
]


class EncodedShards(Dataset[Any]):
    """Batched reads of a JPEG-mode shard set, as ``ShardDataset(decode=False)`` returns."""

    def __init__(self, root: Path) -> None:
        self.reader = ShardReader(root)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitems__(self, indices: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        blobs = self.reader.read_batch("image", indices)
        labels = torch.from_numpy(np.asarray(self.reader.read_batch("label", indices)))
        return [torch.from_numpy(np.array(b)) for b in blobs], labels

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])


def _pass_through(batch: Any) -> Any:
    return batch


def _write_shard(root: Path, blobs: list[bytes]) -> Path:
    """A one-shard set at ``root`` of the JPEG ``blobs``, labels 100 + index."""
    with ShardWriter(root / "shard-00000.h5", FIELDS) as writer:
        for i, blob in enumerate(blobs):
            writer.append({"image": blob, "label": 100 + i})
        info = writer.close()
    save_manifest(root, Manifest(fields=FIELDS, shards=[info]))
    return root


@pytest.fixture
def shard_root(tmp_path: Path) -> Path:
    blobs = [rgb_jpeg(60 + 4 * i, 80, seed=i) for i in range(10)]
    blobs[3] = blobs[3][:40]  # truncated: does not decode
    return _write_shard(tmp_path, blobs)


def _loader(root: Path, num_workers: int = 0) -> DataLoader[Any]:
    return DataLoader(
        EncodedShards(root), batch_size=4, collate_fn=_pass_through, num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_labels_follow_images_through_skips(shard_root: Path, num_workers: int) -> None:
    decoder = create_decoder("cpu", size=32, on_error="skip")
    batches = list(DecodingLoader(_loader(shard_root, num_workers), decoder))
    assert [tuple(images.shape) for images, _ in batches] == [(3, 3, 32, 32), (4, 3, 32, 32),
                                                               (2, 3, 32, 32)]  # fmt: skip
    labels = torch.cat([labels for _, labels in batches]).tolist()
    assert labels == [100, 101, 102, 104, 105, 106, 107, 108, 109]
    single = decoder([rgb_jpeg(60 + 4 * 5, 80, seed=5)])
    assert torch.equal(batches[1][0][1], single[0])  # sample 5 is second in batch two


def test_last_batch_policies(shard_root: Path) -> None:
    decoder = create_decoder("cpu", size=16, on_error="skip")
    dropped = list(DecodingLoader(_loader(shard_root), decoder, last_batch="drop"))
    assert [len(labels) for _, labels in dropped] == [4]
    padded = list(DecodingLoader(_loader(shard_root), decoder, last_batch="pad", batch_size=4))
    assert [len(labels) for _, labels in padded] == [4, 4, 4]
    assert padded[0][1].tolist() == [100, 101, 102, 100]
    assert padded[2][1].tolist() == [108, 109, 108, 109]
    assert torch.equal(padded[2][0][0], padded[2][0][2])
    assert padded[2][0].is_contiguous(memory_format=torch.channels_last)
    assert len(DecodingLoader(_loader(shard_root), decoder)) == 3


def test_masks_and_lists_travel_alongside(images: dict[str, bytes]) -> None:
    encoded = [images["color"], images["corrupt"], images["gray"]]
    masks = torch.arange(3 * 2 * 2).reshape(3, 2, 2)
    names = ["a", "b", "c"]
    decoder = create_decoder("cpu", size=8, on_error="skip")
    ((out, out_masks, out_names),) = list(DecodingLoader([(encoded, masks, names)], decoder))
    assert out.shape[0] == 2 and out_names == ["a", "c"]
    assert torch.equal(out_masks, masks[[0, 2]])


def test_rejects_bad_arguments(images: dict[str, bytes]) -> None:
    decoder = create_decoder("cpu", size=8)
    with pytest.raises(ValueError, match="last_batch must be one of"):
        DecodingLoader([], decoder, last_batch="fill")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        DecodingLoader([], decoder, batch_size=0)
    with pytest.raises(TypeError, match="decoder must come from create_decoder"):
        DecodingLoader([], lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batch 0 must be a tuple"):
        list(DecodingLoader([images["color"]], decoder))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="batch element 1 must be a tensor or a list"):
        list(DecodingLoader([([images["color"]], 7)], decoder))


def test_fields_pass_through_untouched_when_every_sample_decodes(
    images: dict[str, bytes],
) -> None:
    # No index_select when nothing was dropped: the same tensor (pinned memory stays pinned
    # for the non_blocking copy to the device), not a pageable copy.
    labels = torch.arange(2)
    masks = torch.zeros(2, 8, 8, dtype=torch.uint8)
    decoder = create_decoder("cpu", size=8, on_error="skip")
    ((_, out_labels, out_masks),) = list(
        DecodingLoader([([images["color"], images["gray"]], labels, masks)], decoder)
    )
    assert out_labels is labels and out_masks is masks


def test_cpu_decoder_decodes_in_the_dataloader_workers(
    shard_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = create_decoder("cpu", size=32, on_error="skip")
    in_main = [decoder([rgb_jpeg(60 + 4 * i, 80, seed=i)])[0] for i in (0, 9)]

    def not_here(encoded: Any) -> Any:
        raise AssertionError("decoded in the main process")

    monkeypatch.setattr(decoder, "decode", not_here)
    loader = DecodingLoader(_loader(shard_root, num_workers=2), decoder)
    assert loader.decodes_in_workers
    batches = list(loader)
    assert [len(labels) for _, labels in batches] == [3, 4, 2]
    assert torch.cat([labels for _, labels in batches]).tolist() == [
        100, 101, 102, 104, 105, 106, 107, 108, 109
    ]  # fmt: skip
    assert torch.equal(batches[0][0][0], in_main[0])  # same pixels as in the main process
    assert torch.equal(batches[2][0][1], in_main[1])
    assert batches[0][0].is_contiguous(memory_format=torch.channels_last)
    # a second pass reuses the worker DataLoader
    assert sum(len(labels) for _, labels in loader) == 9


def test_decode_errors_from_workers_follow_on_error_here(shard_root: Path) -> None:
    raising = DecodingLoader(_loader(shard_root, 2), create_decoder("cpu", size=16))
    with pytest.raises(DecodeError, match="batch item 3") as caught:
        list(raising)
    assert caught.value.reason == "truncated"  # unchanged by the trip from the worker
    warning = DecodingLoader(
        _loader(shard_root, 2), create_decoder("cpu", size=16, on_error="warn")
    )
    with pytest.warns(RuntimeWarning, match="skipped a sample: "):
        assert sum(len(labels) for _, labels in warning) == 9
    padded = DecodingLoader(
        _loader(shard_root, 2), create_decoder("cpu", size=16, on_error="skip"), last_batch="pad"
    )
    assert [labels.tolist() for _, labels in padded] == [
        [100, 101, 102, 100],
        [104, 105, 106, 107],
        [108, 109, 108, 109],
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_damaged_jpeg_decoded_in_workers_follows_on_error_here(
    tmp_path: Path, num_workers: int
) -> None:
    blobs = [rgb_jpeg(60, 80, seed=i) for i in range(6)]
    blobs[4] = damaged_jpeg(60, 80)
    _write_shard(tmp_path, blobs)
    raising = DecodingLoader(_loader(tmp_path, num_workers), create_decoder("cpu", size=16))
    with pytest.raises(DecodeError, match=r"Corrupt JPEG data: .*: batch item 0$"):
        list(raising)
    skipping = create_decoder("cpu", size=16, on_error="skip")
    labels = [
        labels.tolist() for _, labels in DecodingLoader(_loader(tmp_path, num_workers), skipping)
    ]
    assert labels == [[100, 101, 102, 103], [105]]
    keeping = create_decoder("cpu", size=16, on_error="warn")
    with pytest.warns(RuntimeWarning, match=r"kept a damaged sample: .*batch item 0$"):
        batches = list(DecodingLoader(_loader(tmp_path, num_workers), keeping))
    assert [labels.tolist() for _, labels in batches] == [[100, 101, 102, 103], [104, 105]]


def test_random_crops_differ_between_workers(tmp_path: Path) -> None:
    blob = rgb_jpeg(200, 240, seed=1)
    with ShardWriter(tmp_path / "shard-00000.h5", FIELDS) as writer:
        for i in range(8):
            writer.append({"image": blob, "label": i})
        info = writer.close()
    save_manifest(tmp_path, Manifest(fields=FIELDS, shards=[info]))
    decoder = create_decoder("cpu", size=24, random_crop=True, seed=0)
    images = torch.cat([images for images, _ in DecodingLoader(_loader(tmp_path, 2), decoder)])
    distinct = {images[i].numpy().tobytes() for i in range(len(images))}
    assert len(distinct) == len(images)  # no two workers replay the same crops


def test_decode_in_workers_can_be_turned_off(shard_root: Path) -> None:
    decoder = create_decoder("cpu", size=16, on_error="skip")
    loader = DecodingLoader(_loader(shard_root, 2), decoder, decode_in_workers=False)
    assert not loader.decodes_in_workers
    assert sum(len(labels) for _, labels in loader) == 9


def test_decoding_in_workers_serves_the_sampler_of_a_dataset_loader(shard_root: Path) -> None:
    # rank 1 of 2: the worker loader serves the sampler the dataset.loader(...) was given
    sampler = ShardAwareDistributedSampler([10], 2, 1, shuffle=False)
    loader = ResumableDataLoader(
        EncodedShards(shard_root), batch_size=2, sampler=sampler, num_workers=1
    )
    decoding = DecodingLoader(loader, create_decoder("cpu", size=32, on_error="skip"))
    assert decoding.decodes_in_workers
    labels = torch.cat([labels for _, labels in decoding]).tolist()
    assert labels == [105, 106, 107, 108, 109]


# -- resuming --------------------------------------------------------------------------------
class ReadingAhead(CpuDecoder):
    """Decodes batch ``i`` only once batch ``i + 1`` was read (as DALI works ahead)."""

    def decode_stream(
        self,
        batches: Iterable[Sequence[Any]],
        *,
        sources: Iterable[Sequence[str] | None] | None = None,
        keys: Iterable[tuple[int, Sequence[int]] | None] | None = None,
    ) -> Iterator[DecodedBatch]:
        names = iter(sources) if sources is not None else None
        batch_keys = iter(keys) if keys is not None else None
        pending = None
        for encoded in batches:
            named = next(names, None) if names is not None else None
            keyed = next(batch_keys, None) if batch_keys is not None else None
            if pending is not None:
                yield self.decode(pending[0], sources=pending[1], keys=pending[2])
            pending = (encoded, named, keyed)
        if pending is not None:
            yield self.decode(pending[0], sources=pending[1], keys=pending[2])


@pytest.fixture(scope="module")
def labelled_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """22 small JPEGs in two shards, labels 0..21."""
    root = tmp_path_factory.mktemp("labelled")
    infos = []
    for number, labels in enumerate((range(12), range(12, 22))):
        with ShardWriter(root / f"shard-{number:05d}.h5", FIELDS) as writer:
            for label in labels:
                writer.append({"image": rgb_jpeg(24, 32, seed=label), "label": label})
            infos.append(writer.close())
    save_manifest(root, Manifest(fields=FIELDS, shards=infos))
    return root


def _resumable(root: Path, num_workers: int, decode_in_workers: bool) -> DecodingLoader:
    dataset = ShardDataset(root, fields=("image", "label"), decode=False, num_threads=1)
    sampler = ShardAwareDistributedSampler(dataset, 1, 0, seed=3)
    sampler.set_epoch(1)
    workers = {"num_workers": num_workers, "prefetch_factor": 2} if num_workers else {}
    loader = dataset.loader(batch_size=4, sampler=sampler, **workers)
    decoder = ReadingAhead(16, on_error="skip", num_threads=1)
    return DecodingLoader(loader, decoder, decode_in_workers=decode_in_workers)


@pytest.mark.parametrize(
    ("num_workers", "decode_in_workers"),
    [(0, True), (2, True), (2, False)],
    ids=["no-workers", "decoded-in-workers", "workers-decoded-here"],
)
def test_state_dict_resumes_exactly_without_the_batches_read_ahead(
    labelled_root: Path, num_workers: int, decode_in_workers: bool
) -> None:
    whole = [int(i) for _, labels in _resumable(labelled_root, num_workers, decode_in_workers)
             for i in labels]  # fmt: skip
    assert sorted(whole) == list(range(22))
    first = _resumable(labelled_root, num_workers, decode_in_workers)
    batches = iter(first)
    head = [int(i) for _ in range(2) for i in next(batches)[1]]
    state = first.state_dict()
    assert (state["sampler"]["num_consumed"], state["num_batches"]) == (8, 2)
    inner = first.batches
    assert isinstance(inner, ResumableDataLoader) and isinstance(
        inner.sampler, ShardAwareDistributedSampler
    )
    assert inner.state_dict()["sampler"] == state["sampler"]  # the inner loader agrees,
    assert inner.sampler.state_dict() == state["sampler"]  # and so does the sampler
    del batches

    resumed = _resumable(labelled_root, num_workers, decode_in_workers)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    tail = [int(i) for _, labels in resumed for i in labels]
    assert head + tail == whole


def test_state_dict_needs_a_resumable_loader(shard_root: Path) -> None:
    decoder = create_decoder("cpu", size=16, on_error="skip")
    with pytest.raises(TypeError, match=r"state_dict\(\) needs batches from a fastdata Resum"):
        DecodingLoader(_loader(shard_root), decoder).state_dict()


def test_index_tensors_and_fields_go_to_the_device_through_copy_to_device(
    images: dict[str, bytes], fake_cuda_uploads: list[tuple[tuple[int, ...], str]]
) -> None:
    # `tensor.to("cuda")` of a pageable index or label tensor blocks the host until the
    # queued training work is done: every host tensor goes through copy_to_device.
    decoder = create_decoder("cpu", size=16, device="cuda:0", on_error="skip", num_threads=1)
    batches = [([images["color"], images["corrupt"], images["large"]], torch.tensor([0, 1, 2]))]
    ((decoded, labels),) = list(DecodingLoader(batches, decoder, last_batch="pad", batch_size=3))
    assert labels.tolist() == [0, 2, 0] and decoded.shape == (3, 3, 16, 16)
    assert fake_cuda_uploads == [
        ((3, 16, 16, 3), "pinned"),
        ((2, 3, 16, 16), "cuda:0"),  # the two images that decoded
        ((3,), "cuda:0"),  # the labels, kept and padded on the host
    ]


@pytest.fixture
def damaged_at_5_truncated_at_9(tmp_path: Path) -> Path:
    """12 JPEGs, labels 100 + index: index 5's data is damaged (decodes with a libjpeg
    warning), index 9 is truncated (does not decode)."""
    blobs = [rgb_jpeg(60, 80, seed=i) for i in range(12)]
    blobs[5] = damaged_jpeg(60, 80)
    blobs[9] = blobs[9][:40]
    return _write_shard(tmp_path, blobs)


def _shuffled(root: Path, num_workers: int, seed: int) -> ResumableDataLoader:
    generator = torch.Generator().manual_seed(seed)
    dataset = ShardDataset(root, decode=False)
    return dataset.loader(batch_size=4, shuffle=True, generator=generator, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_decode_errors_name_the_dataset_index_over_a_dataset_loader(
    damaged_at_5_truncated_at_9: Path, num_workers: int
) -> None:
    root = damaged_at_5_truncated_at_9
    for seed in range(3):  # shuffled: the bad samples sit at other batch items each time
        with pytest.raises(DecodeError) as caught:
            list(DecodingLoader(_shuffled(root, num_workers, seed), create_decoder("cpu", size=16)))
        error = caught.value
        named = re.fullmatch(r"dataset\[(\d+)\] \(batch item [0-3]\)", error.source)
        assert named is not None, error
        assert int(named[1]) == (5 if "Corrupt JPEG data" in error.message else 9), error
        assert str(error).endswith(error.source)

        keeping = create_decoder("cpu", size=16, on_error="warn")
        with warnings.catch_warnings(record=True) as caught_warnings:
            warnings.simplefilter("always")
            batches = list(DecodingLoader(_shuffled(root, num_workers, seed), keeping))
        messages = sorted(str(w.message) for w in caught_warnings)
        assert len(messages) == 2
        kept = re.fullmatch(
            r"kept a damaged sample: .*Corrupt JPEG data: .*: dataset\[5\] \(batch item (\d)\)",
            messages[0],
        )
        assert kept is not None, messages
        assert re.fullmatch(r"skipped a sample: .*: dataset\[9\] \(batch item \d\)", messages[1]), (
            messages
        )
        # the batch item named is where the damaged sample (label 105) was kept
        (position,) = [
            labels.tolist().index(105) for _, labels in batches if 105 in labels.tolist()
        ]
        assert position == int(kept[1])


def test_decode_errors_name_batch_items_for_other_iterables(
    damaged_at_5_truncated_at_9: Path,
) -> None:
    decoder = create_decoder("cpu", size=16, on_error="warn")
    plain = DataLoader(
        ShardDataset(damaged_at_5_truncated_at_9, decode=False),
        batch_size=4,
        collate_fn=_pass_through,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(DecodingLoader(plain, decoder))
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2, messages
    assert messages[0].startswith("kept a damaged sample: ") and messages[0].endswith(
        ": batch item 1"
    )
    assert messages[1].startswith("skipped a sample: ") and messages[1].endswith(": batch item 1")


def test_fields_the_decoder_would_misalign_are_refused_by_role(tmp_path: Path) -> None:
    fields = [*FIELDS, FieldSpec("mask", "array", "uint8", (8, 8), "HW")]
    with ShardWriter(tmp_path / "shard-00000.h5", fields) as writer:
        for i in range(4):
            mask = np.full((8, 8), i, np.uint8)
            writer.append({"image": rgb_jpeg(64, 80, seed=i), "label": i, "mask": mask})
        info = writer.close()
    save_manifest(tmp_path, Manifest(fields=fields, shards=[info]))
    decoder = create_decoder("cpu", size=16)
    with_mask = ShardDataset(tmp_path, fields=("image", "label", "mask"), decode=False)
    assert with_mask.roles["mask"] == "mask"
    for num_workers in (0, 2):  # decoding here or in the workers
        loader = with_mask.loader(batch_size=2, num_workers=num_workers)
        with pytest.raises(ValueError, match=r"field 'mask' \(role 'mask'\) would not follow"):
            DecodingLoader(loader, decoder)
    # the labels alone follow the images; roles given for a plain iterable are checked too
    labels_only = ShardDataset(tmp_path, fields=("image", "label"), decode=False)
    ((images, labels), _) = list(DecodingLoader(labels_only.loader(batch_size=2), decoder))
    assert images.shape == (2, 3, 16, 16) and labels.tolist() == [0, 1]
    batch = ([rgb_jpeg(64, 80)], [torch.zeros(1, 4)])
    with pytest.raises(ValueError, match=r"field 'field 1' \(role 'boxes'\) would not follow"):
        DecodingLoader([batch], decoder, roles=("boxes",))
    with pytest.raises(ValueError, match="role must be one of"):
        DecodingLoader([batch], decoder, roles=("corners",))
    assert len(list(DecodingLoader([batch], decoder, roles=("other",)))) == 1

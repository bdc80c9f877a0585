"""RAMDataset specifics: packing, memory checks, shared memory and its release."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fastdata import _system
from fastdata.datasets import RAMDataset, ShardDataset
from fastdata.errors import InsufficientMemoryError
from tests.datasets.conftest import NUM_SAMPLES, Reference


def test_files_are_packed_into_one_buffer(image_files: tuple[list[Path], Reference]) -> None:
    paths, ref = image_files
    dataset = RAMDataset(paths, ref.labels, show_progress=False)
    payload = sum(len(data) for data in ref.jpegs)
    path_bytes = sum(len(str(p).encode()) for p in paths)
    assert dataset.nbytes == payload + 8 * (NUM_SAMPLES + 1) * 2 + 8 * NUM_SAMPLES + path_bytes
    report = dataset.memory_report()
    assert report.field_bytes["image"] == payload + 8 * (NUM_SAMPLES + 1)
    assert report.total_bytes == dataset.nbytes and report.shared
    assert "22 samples" in str(report) and "shared memory" in str(report)
    encoded, labels = RAMDataset(paths, ref.labels, decode=False).__getitems__([3, 1])
    assert [bytes(t.numpy()) for t in encoded] == [ref.jpegs[3], ref.jpegs[1]]
    np.testing.assert_array_equal(labels.numpy(), ref.labels[[3, 1]])


def test_images_without_targets(image_files: tuple[list[Path], Reference]) -> None:
    paths, ref = image_files
    images = RAMDataset(paths, None, show_progress=False).__getitems__([0, 2])
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), ref.images[[0, 2]])


def test_bad_inputs(image_files: tuple[list[Path], Reference]) -> None:
    paths, ref = image_files
    with pytest.raises(ValueError, match="image_paths must be a non-empty sequence"):
        RAMDataset([], [])
    with pytest.raises(
        ValueError, match=r"targets must be 22 labels \(one per image\), got shape \(3,\)"
    ):
        RAMDataset(paths, [0, 1, 2])
    with pytest.raises(TypeError, match="targets must be integers, got dtype float64"):
        RAMDataset(paths, np.zeros(NUM_SAMPLES))
    rule = r"targets\[{}\] has label {}; labels must be integers in 0\.\.9223372036854775807$"
    for bad in (-1, 2**63, 2**70):
        targets = [0] * NUM_SAMPLES
        targets[4] = bad
        with pytest.raises(ValueError, match=rule.format(4, bad)):
            RAMDataset(paths, targets)
    with pytest.raises(ValueError, match=rule.format(2, 2**64 - 1)):
        RAMDataset(paths, np.array([0, 1, 2**64 - 1] + [0] * (NUM_SAMPLES - 3), np.uint64))
    with pytest.raises(ValueError, match=rule.format(1, -5)):
        RAMDataset.from_arrays(ref.images, torch.tensor([0, -5] + [0] * (NUM_SAMPLES - 2)))
    with pytest.raises(FileNotFoundError, match=r"image_paths\[1\] cannot be read: .*missing\.png"):
        RAMDataset([paths[0], paths[0].parent / "missing.png"], [0, 1])
    with pytest.raises(ValueError, match=r"images must be a uint8 array with 3 or 4 dimensions"):
        RAMDataset.from_arrays(ref.images.astype(np.float32), ref.labels)
    with pytest.raises(ValueError, match="arrays must all have the same length"):
        RAMDataset.from_arrays(ref.images, ref.labels, masks=ref.masks[:3])
    with pytest.raises(TypeError, match=r"unexpected read options \['colour'\]"):
        RAMDataset.from_arrays(ref.images, ref.labels, colour=True)


def test_from_arrays_with_masks_and_tensors(raw_shards: Reference) -> None:
    dataset = RAMDataset.from_arrays(
        torch.from_numpy(raw_shards.images), raw_shards.labels, masks=raw_shards.masks, layout="HWC"
    )
    images, labels, masks = dataset.__getitems__([6, 0])
    np.testing.assert_array_equal(images.numpy(), raw_shards.images[[6, 0]])
    np.testing.assert_array_equal(masks.numpy(), raw_shards.masks[[6, 0]])
    assert labels.tolist() == raw_shards.labels[[6, 0]].tolist()


def test_from_shards_has_the_manifest_and_class_names_of_the_shard_dataset(
    raw_shards: Reference, image_files: tuple[list[Path], Reference]
) -> None:
    on_disk = ShardDataset(raw_shards.path)
    in_ram = RAMDataset.from_shards(raw_shards.path, show_progress=False)
    assert in_ram.manifest == on_disk.manifest and in_ram.manifest is not None
    assert in_ram.class_names == on_disk.class_names == list("abcde")
    copied = pickle.loads(pickle.dumps(in_ram))  # what a spawned worker gets
    assert copied.manifest == on_disk.manifest and copied.class_names == list("abcde")
    for no_manifest in (
        RAMDataset.from_arrays(raw_shards.images, raw_shards.labels),
        RAMDataset(image_files[0], None, show_progress=False),
    ):
        assert no_manifest.manifest is None and no_manifest.class_names == []


def test_memory_check_refuses_naming_both_figures(
    raw_shards: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_system, "available_memory_bytes", lambda: 1000)
    needed = raw_shards.images.nbytes + raw_shards.labels.nbytes
    with pytest.raises(
        InsufficientMemoryError,
        match=rf"needs about .* \({needed} bytes\) but only 1000 B \(1000 bytes\)",
    ):
        RAMDataset.from_shards(raw_shards.path, show_progress=False)
    dataset = RAMDataset.from_shards(raw_shards.path, check_memory=False, show_progress=False)
    assert dataset.nbytes == needed


def _fastdata_memfds() -> set[str]:
    """Every fastdata memfd mapped by any process, as ``pid:name``."""
    found = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        found |= {
            f"{maps.parent.name}:{line.split()[-2]}"
            for line in text.splitlines()
            if "memfd:fastdata-" in line
        }
    return found


_CHILD = textwrap.dedent(
    """
    import sys, time
    from torch.utils.data import DataLoader
    from fastdata.datasets import RAMDataset, passthrough_collate
    dataset = RAMDataset.from_shards(sys.argv[1], show_progress=False)
    loader = DataLoader(dataset, batch_size=2, num_workers=1, multiprocessing_context="spawn",
                        persistent_workers=True, collate_fn=passthrough_collate)
    next(iter(loader))
    print("ready", flush=True)
    time.sleep(60)
    """
)


def _group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid``, each with its command line."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members[int(stat.parent.name)] = command
    return members


def test_no_shared_memory_left_after_a_crash(raw_shards: Reference, tmp_path: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(raw_shards.path)],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # multiprocessing's folder, left by a crash
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        held = {entry for entry in _fastdata_memfds() if f"-{child.pid}" in entry}
        assert len({entry.split(":")[0] for entry in held}) == 2  # the parent and its worker
    finally:
        # The parent and its worker die at once, no clean-up code runs. Python's resource
        # tracker is spared: it unlinks multiprocessing's own semaphores (sem.mp-*) when they
        # are gone, which nothing does once it is killed too.
        group = _group(child.pid)
        tracker = [pid for pid, command in group.items() if "resource_tracker" in command]
        for pid in set(group) - set(tracker):
            os.kill(pid, signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 10
    while any(f"-{child.pid}" in entry for entry in _fastdata_memfds()):
        assert time.monotonic() < deadline, "shared memory still mapped after the crash"
        time.sleep(0.1)
    while set(tracker) & set(_group(child.pid)):
        assert time.monotonic() < deadline, "the resource tracker outlived the crash"
        time.sleep(0.1)
    assert set(os.listdir("/dev/shm")) - shm_before == set()

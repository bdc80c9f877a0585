"""The cache of remote shards: its byte limit holds at every moment, a limit below one
shard is refused, a full cache evicts (or reads into memory) instead of stalling."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from fastdata import ShardAwareDistributedSampler, ShardDataset
from fastdata._storage import HeldShard, ShardCache, _backend, parse_bytes
from fastdata._storage._cache import RemoteShard
from fastdata.datasets import passthrough_collate
from fastdata.shards import load_manifest
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import upload_folder, write_set


class UsageWatcher:
    """Sums the sizes of the cache folder's files in a loop, keeping the largest total."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.sample()

    def _scan(self) -> int:
        sizes: dict[str, int] = {}  # by name without suffix: a rename seen twice counts once
        if self.folder.exists():
            for entry in os.scandir(self.folder):
                stem, dot, suffix = entry.name.rpartition(".")
                if dot and suffix in ("h5", "part"):
                    with contextlib.suppress(FileNotFoundError):
                        sizes[stem] = max(sizes.get(stem, 0), entry.stat().st_size)
        return sum(sizes.values())

    def sample(self) -> int:
        # A directory listing is no snapshot: a file evicted after the listing passed it and
        # one created before the listing reaches it both show, though they never coexisted.
        # What two listings in a row both see was there.
        total = min(self._scan(), self._scan())
        self.peak = max(self.peak, total)
        return total

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _epochs(
    dataset: ShardDataset,
    epochs: int,
    num_workers: int,
    window_shards: int,
    check: callable | None = None,
) -> list[int]:  # type: ignore[valid-type]
    """Labels seen over ``epochs`` (label = sample index), each batch's images checked
    against ``check``."""
    sampler = ShardAwareDistributedSampler(
        dataset, num_replicas=1, rank=0, seed=1, window_shards=window_shards
    )
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=num_workers,
                        collate_fn=passthrough_collate,
                        multiprocessing_context="fork" if num_workers else None)  # fmt: skip
    seen: list[int] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            if check is not None:
                check(images, labels)
            seen.extend(labels.tolist())
    return seen


def persistent_loader(
    dataset: ShardDataset, sampler: ShardAwareDistributedSampler, num_workers: int
) -> DataLoader:
    """Batches of 4 from ``sampler``'s order, its workers (forked) kept between epochs."""
    return DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=num_workers,
                      collate_fn=passthrough_collate, persistent_workers=num_workers > 0,
                      multiprocessing_context="fork" if num_workers else None)  # fmt: skip


@pytest.mark.parametrize(("num_workers", "shards_in_cache"), [(0, 2), (2, 2), (2, 1)])
def test_the_limit_holds_at_every_moment_and_every_sample_comes_once(
    bucket: str, tmp_path: Path, proxy: FaultProxy, num_workers: int, shards_in_cache: int
) -> None:
    local = write_set(tmp_path / "set", (8, 8, 8, 8, 8, 6))
    url = upload_folder(bucket, local, "capped")
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    limit = shards_in_cache * largest
    reference = ShardDataset(local)

    def check(images: torch.Tensor, labels: torch.Tensor) -> None:
        expected = reference.__getitems__(labels.tolist())[0]
        assert torch.equal(images, expected)
        assert watcher.sample() <= limit  # between batches too

    cache = tmp_path / "cache"
    watcher = UsageWatcher(cache)
    dataset = ShardDataset(url, cache_dir=cache, cache_limit=limit)
    with pytest.warns(UserWarning, match="fewer than the 3 this order reads at once"):
        seen = _epochs(dataset, 2, num_workers, window_shards=2, check=check)
    peak = watcher.stop()
    assert sorted(seen) == sorted(list(range(46)) * 2)
    assert 0 < peak <= limit
    assert sum(n for p, n in proxy.gets.items() if p.endswith(".h5")) > 6  # it evicted


def test_a_limit_below_one_shard_is_refused_in_one_line(bucket: str, tmp_path: Path) -> None:
    local = write_set(tmp_path / "set")
    url = upload_folder(bucket, local, "small")
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    with pytest.raises(ValueError, match=r"^cache_limit 1000 \(1000 bytes\) is smaller than "
                       rf"the largest shard of {url} \({largest} bytes\)"):  # fmt: skip
        ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=1000)
    with pytest.raises(ValueError, match="cache_limit must be a byte count such as"):
        ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit="lots")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_cache_already_full_of_other_shards_evicts_them(
    bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    """Leftovers of another set fill the cache: they go, least recently used first."""
    local = write_set(tmp_path / "set")
    url = upload_folder(bucket, local, "set")
    other = upload_folder(bucket, write_set(tmp_path / "other", seed=5), "other")
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    cache = tmp_path / "cache"
    _epochs(ShardDataset(other, cache_dir=cache), 1, 0, 1)  # fills it, no limit
    before = {p.name for p in cache.glob("*.h5")}
    seen = _epochs(ShardDataset(url, cache_dir=cache, cache_limit=3 * largest), 1, 0, 1)
    assert sorted(seen) == list(range(38))
    after = {p.name for p in cache.glob("*.h5")}
    assert len(after) <= 3 and not after & before


@pytest.mark.parametrize(
    ("text", "expected"),
    [("200MB", 200 * 10**6), ("1.5GiB", 3 * 2**29), ("512k", 512_000), ("64KiB", 65536),
     ("1000", 1000), (4096, 4096), ("2 G", 2 * 10**9), ("3mib", 3 * 2**20)],
)  # fmt: skip
def test_byte_counts_take_a_unit(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "MB", "-5MB", "0", "5 XB", "1e3", "Gi"])
def test_a_bad_byte_count_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cache_limit must be a"):
        parse_bytes(bad)
    with pytest.raises(TypeError, match="cache_limit must be an int or a string"):
        parse_bytes(2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_cache_that_holds_the_window_downloads_each_shard_once_an_epoch(
    bucket: str, tmp_path: Path, proxy: FaultProxy, num_workers: int
) -> None:
    """The sampler reads 2 shards at once; a cache of 6 shards holds them where the loader
    reads them and where the sampler hands them out, and one read ahead: no shard is
    downloaded twice in an epoch (none evicted before its use, none read into memory)."""
    local = write_set(tmp_path / "set", (8,) * 8)
    url = upload_folder(bucket, local, "window")
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=6 * largest)
    sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=3, window_shards=2)
    loader = persistent_loader(dataset, sampler, num_workers)
    for epoch in range(2):
        proxy.gets.clear()
        sampler.set_epoch(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # room enough: no warning of a small cache
            seen = [label for _, labels in loader for label in labels.tolist()]
        assert sorted(seen) == list(range(64))
        shard_gets = {path: n for path, n in proxy.gets.items() if path.endswith(".h5")}
        assert max(shard_gets.values(), default=0) <= 1, shard_gets
        if epoch == 0:
            assert len(shard_gets) == 8


class GatedStore:
    """An object store in memory (one object) whose downloads wait for ``gate``."""

    attempts = 1

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.gate = threading.Event()
        self.started = threading.Event()
        self.downloads = 0

    def stream(self, key: str) -> Iterator[memoryview]:
        self.downloads += 1
        self.started.set()
        if not self.gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        yield memoryview(self.data)


def _wait_for_a_blocked_lock(path: Path, waiters: int = 1) -> None:
    """Until ``waiters`` threads wait for a lock on ``path`` (``/proc/locks`` lists them)."""
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing margin
    while time.monotonic() < deadline:
        if _lock_waiters(path) >= waiters:
            return
        time.sleep(0.001)
    raise AssertionError(f"fewer than {waiters} waited for the lock on {path}")


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_shard_renamed_into_place_while_another_reader_waits_is_not_downloaded_again(
    tmp_path: Path,
) -> None:
    """Reader B finds no shard file, then waits for the folder's lock, as does reader A to
    rename its finished download into place. Whichever gets the lock first, B holds A's
    file: no second download (which would also evict another shard for room it does not
    need)."""
    data = os.urandom(4096)
    shard = RemoteShard("s3://b/s.h5", "s.h5", len(data), hashlib.sha256(data).hexdigest())
    cache = ShardCache(tmp_path / "cache", 8192)
    store = GatedStore(data)
    held: dict[str, object] = {}
    client = lambda: store  # noqa: E731
    reader_a = threading.Thread(target=lambda: held.setdefault("a", cache.fetch(client, shard)))
    reader_a.start()
    assert store.started.wait(60)  # A is downloading
    folder_lock = os.open(tmp_path / "cache" / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(folder_lock, fcntl.LOCK_EX)  # a third process reserving space
    store.gate.set()
    _wait_for_a_blocked_lock(tmp_path / "cache" / ".lock")  # A waits to rename
    reader_b = threading.Thread(target=lambda: held.setdefault("b", cache.fetch(client, shard)))
    reader_b.start()
    _wait_for_a_blocked_lock(tmp_path / "cache" / ".lock", 2)  # B looked, found no file
    fcntl.flock(folder_lock, fcntl.LOCK_UN)
    os.close(folder_lock)
    reader_a.join()
    reader_b.join()
    assert store.downloads == 1
    assert [p.name for p in (tmp_path / "cache").glob("*.h5")] == [f"{shard.sha256}.h5"]
    for reader in held.values():
        reader.release()  # type: ignore[attr-defined]


def test_a_reader_holds_only_the_shards_of_the_batch_it_reads(bucket: str, tmp_path: Path) -> None:
    """A shard the current batch does not read is let go at once (a capped cache can evict
    it): a reader process holding the shards of earlier batches too filled the cache with
    shards no one reads, and another shard then went to memory or was evicted early."""
    local = write_set(tmp_path / "set", (8, 8, 8))
    url = upload_folder(bucket, local, "held")
    shards = load_manifest(local).shards
    largest = max(info.num_bytes for info in shards)
    cache = tmp_path / "cache"
    dataset = ShardDataset(url, cache_dir=cache, cache_limit=3 * largest)

    def held_by_readers() -> list[int]:
        held = []
        for number, info in enumerate(shards):
            fd = os.open(cache / f"{info.sha256}.h5", os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(number)
            finally:
                os.close(fd)
        return held

    dataset.__getitems__([8, 9, 20])  # shards 1 and 2
    dataset.__getitems__([0, 1])  # shard 0 (all three cached now)
    assert held_by_readers() == [0]
    dataset.__getitems__([10, 3])
    assert held_by_readers() == [0, 1]


def test_a_cache_below_what_the_order_reads_at_once_is_warned_about_once(
    bucket: str, tmp_path: Path
) -> None:
    """An order that reads all 8 shards at once (a custom sampler's full shuffle; the
    shard-aware sampler sizes its own to the cache): a cache of 5 cannot hold them where
    the order hands them out and where the loader reads them. Every sample still comes
    once; the user is told (once) why shards are downloaded again, and what to change."""
    local = write_set(tmp_path / "set", (8,) * 8)
    url = upload_folder(bucket, local, "small-cache")
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=5 * largest)
    seen: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            order = torch.randperm(64, generator=torch.Generator().manual_seed(epoch)).tolist()
            for index in dataset.read_ahead(order):
                seen.extend(dataset.__getitems__([index])[1].tolist())
    assert sorted(seen) == sorted(list(range(64)) * 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1, messages
    assert messages[0] == (
        f"cache_limit ({5 * largest} bytes) holds 5 shards of {url}, fewer than the 17 this "
        "order reads at once (8 where the sampler hands samples out, 8 where the loader "
        "reads them, one spare): shards are downloaded more than once an epoch, in the "
        f"loader's time; allow at least {18 * largest} bytes, or shuffle fewer shards "
        "together (the sampler's window_shards)"
    )


def test_a_process_that_finds_its_shards_in_the_cache_creates_no_client(
    bucket: str, tmp_path: Path
) -> None:
    """A DataLoader worker reading shards the sampler's read-ahead downloaded creates no
    client of the store (creating one costs about 0.1-0.25 s of CPU in each process)."""
    local = write_set(tmp_path / "set", (8, 8))
    url = upload_folder(bucket, local, "warm")
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache")
    dataset.__getitems__(list(range(16)))  # both shards in the cache now
    worker_copy = pickle.loads(pickle.dumps(dataset))  # what a worker starts from
    _backend._clients.clear()
    _, labels = worker_copy.__getitems__([15, 0, 9])
    assert labels.tolist() == [15, 0, 9]
    assert _backend._clients == {}


def test_the_read_ahead_keeps_eight_downloads_in_flight(
    bucket: str, tmp_path: Path, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ahead of an order, 8 shard downloads run at once (a store answers each request after
    a delay that parallel requests hide; 4 in flight left the loader waiting on a loopback
    S3 server twice as long), and every sample still comes once, each shard fetched once."""
    local = write_set(tmp_path / "set", (2,) * 12)
    url = upload_folder(bucket, local, "ahead")
    monkeypatch.setenv("FASTDATA_STORAGE_TIMEOUT_S", "600")  # no request retried while held
    _backend._clients.clear()
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache")
    proxy.hold = threading.Event()
    order = dataset.read_ahead(list(range(24)))
    try:
        first = next(order)  # shard 0 is in use: it and the next 8 are fetched
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing margin
        while proxy.held < 8 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert proxy.held == 8
    finally:
        proxy.hold.set()
    _, labels = dataset.__getitems__([first, *order])
    assert labels.tolist() == list(range(24))
    shard_gets = {path: n for path, n in proxy.gets.items() if path.endswith(".h5")}
    assert len(shard_gets) == 12 and set(shard_gets.values()) == {1}, shard_gets


class _Listing:
    """What ``os.scandir`` returns, from a list of entries made already."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self.entries = entries

    def __enter__(self) -> Iterator[os.DirEntry[str]]:
        return iter(self.entries)

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_download_renamed_while_another_reserves_space_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reader B lists the cache folder to make room while reader A's download is renamed
    into place: B counts A's shard (under one of its names) and finds no room, where it
    used to count it under neither and overran the limit by a shard."""
    data = [os.urandom(4096) for _ in range(3)]
    shards = [
        RemoteShard(f"s3://b/{n}.h5", f"{n}.h5", len(d), hashlib.sha256(d).hexdigest())
        for n, d in enumerate(data)
    ]
    stores = [GatedStore(d) for d in data]
    stores[0].gate.set()
    stores[2].gate.set()
    folder = tmp_path / "cache"
    cache = ShardCache(folder, 2 * 4096)
    kept = cache.fetch(lambda: stores[0], shards[0])  # held open: not evictable
    held: dict[str, HeldShard | None] = {}

    def read(name: str, number: int) -> None:
        held[name] = cache.fetch(lambda: stores[number], shards[number])

    reader_a = threading.Thread(target=read, args=("a", 1))
    reader_b = threading.Thread(target=read, args=("b", 2))
    real_scandir = os.scandir

    def scandir_then_let_a_finish(path: Any) -> _Listing:
        entries = list(real_scandir(path))
        if threading.current_thread() is reader_b:
            stores[1].gate.set()  # A's download ends now: A renames it, or waits to
            renamed = folder / f"{shards[1].sha256}.h5"
            deadline = time.monotonic() + 60  # a guard against a hang, not a timing margin
            while not renamed.exists() and not _lock_waiters(folder / ".lock"):
                assert time.monotonic() < deadline, "A neither renamed nor waited"
                time.sleep(0.001)
        return _Listing(entries)

    reader_a.start()
    assert stores[1].started.wait(60)  # A reserved its space and is downloading
    monkeypatch.setattr(os, "scandir", scandir_then_let_a_finish)
    reader_b.start()
    reader_b.join()
    reader_a.join()
    monkeypatch.undo()
    assert cache.usage() <= 2 * 4096
    held_b = held["b"]
    assert held_b is not None and held_b.data == data[2]  # no room: read into memory
    for reader in (*held.values(), kept):
        if reader is not None:
            reader.release()


def _lock_waiters(path: Path) -> int:
    """Threads waiting for a lock on ``path`` now (``/proc/locks`` lists them)."""
    suffix = f":{path.stat().st_ino} "
    with open("/proc/locks") as locks:
        return sum("->" in line and suffix in line for line in locks)

"""Reading shards from an S3-protocol store: fastdata's cache against local disk and peers.

One run: the same photos, preprocessed to 224x224 shards of about ``--shard-mb`` MiB (raw
pixels, or with ``--encoding jpeg`` JPEGs that every row decodes in its loader's workers),
served by moto's S3 server on 127.0.0.1 (a separate process) behind a proxy that adds
``--latency-ms`` to every request. Each row reads two epochs with a DataLoader of
``--workers`` workers and reports, per epoch, images/s; client CPU ms per image (the row's
process and every process it starts: workers, download helpers; the server and proxy are
not counted); the cache folder's peak bytes (sampled every 10 ms) against its limit; the
row's peak RSS; the time to build the dataset; whether every sample came exactly once; and
for fastdata's remote rows, the GETs of shard files the epoch made (counted by the proxy)
and the most of any one shard.
Each row runs in a process of its own, stopped after ``--row-time-limit`` seconds (then
recorded as failed, with the epoch and images it had reached), so a run always finishes.

Rows: ``local`` (the same set on disk), ``fastdata-s3`` (no limit), ``fastdata-s3-capped``
(``cache_limit`` a quarter of the set), then each peer installed (LitData, MosaicML
streaming, webdataset), uncapped and capped at the same quarter, reading the same samples
written in its own format (see ``_storage_peers.py``); a missing one is skipped with one
line. From JPEG shards fastdata reads ``ShardDataset(url, ("image", "path"), decode=True)``
and each peer stores the very JPEG bytes of fastdata's shards and decodes each sample with
``cv2.imdecode`` in its own dataset, as its users would write it; the row names then end in
``-jpeg`` and the figures go to the ``storage-jpeg`` topic. Install the peers in a venv of
their own (torch pinned), never as dependencies. Figures measured on a shared machine are
indicative; compare rows of one run. Rerun with:

    python benchmarks/bench_storage.py [--num-images 4000] [--latency-ms 20]
        [--encoding raw|jpeg] [--publish]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import _storage_peers
import boto3
import cv2
import numpy as np
import psutil
from _harness import REPO_ROOT, add_publish_argument, save
from moto.server import ThreadedMotoServer
from torch.utils.data import DataLoader

from fastdata import PreprocessOptions, ShardAwareDistributedSampler, ShardDataset
from fastdata.datasets import passthrough_collate
from fastdata.preprocess import preprocess
from fastdata.shards import load_manifest

sys.path.insert(0, str(REPO_ROOT))
from tests.storage._proxy import FaultProxy

_BUCKET = "fastdata-bench"
_SHARD_FILE = re.compile(r"/shard-(\d+)\.h5$")  # fastdata's shard files


def make_photos(root: Path, count: int) -> Path:
    """``count`` JPEG photos-like images (smooth gradients plus noise), 10 classes."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:300, 0:400]
    for index in range(count):
        folder = root / f"class{index % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        base = np.stack([xx * (1 + index % 3), yy * (1 + index % 5), xx + yy], -1) // 3
        noise = rng.integers(0, 40, base.shape)
        image = ((base + noise) % 256).astype(np.uint8)
        cv2.imwrite(str(folder / f"{index:06d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    return root


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(port: int) -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    threading.Event().wait()


class _SharedGets(Counter[str]):
    """The proxy's GET counts, those of fastdata's shard files (``shard-<n>.h5``) also
    written into ``counts[n]``, shared with the row processes."""

    def __init__(self, counts: Any) -> None:
        super().__init__()
        self.counts = counts

    def __setitem__(self, path: str, value: int) -> None:
        super().__setitem__(path, value)
        match = _SHARD_FILE.search(path)
        if match is not None and int(match.group(1)) < len(self.counts):
            self.counts[int(match.group(1))] += 1


def _serve_proxy(upstream: str, port_queue: Any, latency_s: float, counts: Any) -> None:
    proxy = FaultProxy(upstream)
    proxy.latency_s = latency_s
    proxy.gets = _SharedGets(counts)
    port_queue.put(proxy.port)
    threading.Event().wait()


@contextlib.contextmanager
def s3_server(latency_ms: float, counts: Any) -> Iterator[str]:
    """An S3 server and a latency proxy, each in its own process; yields the proxy URL.
    The proxy adds each GET of fastdata's shard ``n`` to ``counts[n]`` (shared memory)."""
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    server = context.Process(target=_serve, args=(port,), daemon=True)
    server.start()
    for _ in range(200):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            break
        time.sleep(0.05)
    ports = context.Queue()
    proxy = context.Process(
        target=_serve_proxy,
        args=(f"127.0.0.1:{port}", ports, latency_ms / 1000, counts),
        daemon=True,
    )
    proxy.start()
    try:
        yield f"http://127.0.0.1:{ports.get(timeout=60)}"
    finally:
        proxy.terminate()
        server.terminate()


class Peaks:
    """Samples a folder's bytes (recursively) and a process tree's RSS in a thread."""

    def __init__(self, folder: Path | None, pid: int) -> None:
        self.folder = folder
        self.pid = pid
        self.cache_bytes = 0
        self.rss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
        while not self._stop.wait(0.01):
            if self.folder is not None and self.folder.exists():
                self.cache_bytes = max(self.cache_bytes, folder_bytes(self.folder))
            with contextlib.suppress(psutil.Error, NameError):
                processes = [root, *root.children(recursive=True)]
                self.rss_bytes = max(self.rss_bytes, sum(p.memory_info().rss for p in processes))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def folder_bytes(folder: Path) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def tree_cpu_s() -> float:
    """CPU seconds of this process, its live descendants and those it reaped."""
    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def fastdata_reader(
    path: str,
    limit: int | None,
    workers: int,
    cache: Path | None,
    *,
    window_shards: int = 4,
    encoding: str = "raw",
) -> Any:
    started = time.perf_counter()
    decoding: dict[str, Any] = {"decode": True} if encoding == "jpeg" else {}
    dataset = ShardDataset(path, ("image", "path"), cache_dir=cache, cache_limit=limit, **decoding)
    build_s = time.perf_counter() - started
    sampler = ShardAwareDistributedSampler(
        dataset, num_replicas=1, rank=0, seed=0, window_shards=window_shards
    )
    loader = DataLoader(
        dataset,
        batch_size=64,
        sampler=sampler,
        num_workers=workers,
        collate_fn=passthrough_collate,
        persistent_workers=workers > 0,
    )

    def epoch(number: int) -> Iterator[list[str]]:
        sampler.set_epoch(number)
        for _, paths in loader:
            yield list(paths)

    return build_s, (epoch(number) for number in range(2)), len(dataset)


def _row_process(spec: dict[str, Any], results: Any, progress: Any, shard_gets: Any) -> None:
    """One row, in its own process: build, read two epochs, report."""
    # A spawned process inherits "spawn" as its default start method; loaders then start
    # their workers as on Linux by default (forked), not re-importing this script each.
    multiprocessing.set_start_method("fork", force=True)
    try:
        if spec["kind"] == "fastdata":
            build_s, epochs, expected = fastdata_reader(
                spec["path"], spec["limit"], spec["workers"], spec["cache"],
                window_shards=spec["window_shards"], encoding=spec["encoding"],
            )  # fmt: skip
        else:
            settings = _storage_peers.PeerSettings(
                _BUCKET, spec["prefix"], spec["endpoint"], spec["cache"], spec["limit"],
                spec["workers"], spec["encoding"],
            )  # fmt: skip
            build_s, epochs = _storage_peers.READERS[spec["peer"]](settings)
            expected = spec["num_samples"]
        rows = []
        for number, batches in enumerate(epochs):
            seen: list[str] = []
            gets_before = np.asarray(shard_gets[:])
            cpu, clock = tree_cpu_s(), time.perf_counter()
            for keys in batches:
                seen.extend(keys)
                progress[0], progress[1] = number + 1, len(seen)
            elapsed, cpu = time.perf_counter() - clock, tree_cpu_s() - cpu
            rows.append({
                "images": len(seen),
                "images_per_s": round(len(seen) / elapsed, 1),
                "cpu_ms_per_image": round(1000 * cpu / max(len(seen), 1), 3),
                "every_sample_once": len(set(seen)) == len(seen) == expected,
            })  # fmt: skip
            if spec["kind"] == "fastdata" and spec["path"].startswith("s3://"):
                gets = np.asarray(shard_gets[:]) - gets_before
                rows[-1]["shard_downloads"] = int(gets.sum())  # GETs of shard files
                rows[-1]["most_downloads_of_a_shard"] = int(gets.max())
        results.put({"build_s": round(build_s, 3), "epochs": rows})
    except BaseException as exc:  # reported as the row's outcome
        results.put({"failed": f"{type(exc).__name__}: {' '.join(str(exc).split())[-300:]}"})
    results.close()
    results.join_thread()  # the result is sent before the exit
    os._exit(0)  # peers' loaders may leave non-daemon threads behind


def run_row(spec: dict[str, Any], time_limit_s: float, shard_gets: Any) -> dict[str, Any]:
    """Run one row in a process of its own, killed after ``time_limit_s``; ``shard_gets``
    counts the GETs of each fastdata shard (see :func:`s3_server`)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    progress = context.Array("i", 2, lock=False)
    cache = spec["cache"]
    process = context.Process(target=_row_process, args=(spec, results, progress, shard_gets))
    process.start()
    peaks = Peaks(cache, process.pid)
    outcome: dict[str, Any] | None = None
    with contextlib.suppress(queue.Empty):
        outcome = results.get(timeout=time_limit_s)
    peaks.stop()
    if outcome is None:
        outcome = {"failed": f"no result after {time_limit_s:g} s (epoch {progress[0]}, "
                             f"{progress[1]} images read in it)"}  # fmt: skip
    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    process.join()
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    limit = spec["limit"]
    row = {
        "name": spec["name"],
        **outcome,
        "peak_cache_bytes": peaks.cache_bytes,
        "cache_limit_bytes": limit,
        "peak_rss_mb": round(peaks.rss_bytes / 2**20, 1),
    }
    epochs = row.get("epochs", [])
    text = " | ".join(
        f"epoch {i + 1}: {e['images_per_s']:7.0f} img/s, {e['cpu_ms_per_image']:.2f} ms CPU/img"
        + ("" if e["every_sample_once"] else f" (SAMPLES WRONG: {e['images']})")
        + _downloads_text(e)
        for i, e in enumerate(epochs)
    )
    if "failed" in row:
        text = (text + " | " if text else "") + "FAILED: " + row["failed"]
    print(
        f"{spec['name']:31s} build {row.get('build_s', float('nan')):6.2f} s | {text}"
        f" | cache peak {peaks.cache_bytes / 2**20:.1f} MiB"
        + (f" (limit {limit / 2**20:.1f})" if limit else "")
        + f" | RSS peak {peaks.rss_bytes / 2**20:.0f} MiB",
        flush=True,
    )
    return row


def _downloads_text(epoch: dict[str, Any]) -> str:
    if "shard_downloads" not in epoch:
        return ""
    most = epoch["most_downloads_of_a_shard"]
    return f", {epoch['shard_downloads']} shard GETs (at most {most} of one)"


def server_ceiling(url: str, num_samples: int, threads: int = 8) -> dict[str, Any]:
    """What the server and proxy deliver to plain parallel GETs of every shard (bodies read
    and dropped): the ceiling of any row's first epoch on this machine."""
    location = url.removeprefix("s3://").rstrip("/")
    bucket, _, prefix = location.partition("/")
    client = boto3.client("s3")
    keys = [
        item["Key"]
        for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
        if item["Key"].endswith(".h5")
    ]

    def get(key: str) -> int:
        return len(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    elapsed = time.perf_counter() - started
    row = {
        "name": f"server-ceiling ({threads} parallel GETs)",
        "images_per_s": round(num_samples / elapsed, 1),
        "mb_per_s": round(total / elapsed / 1e6, 1),
    }
    print(f"{row['name']:26s} {row['images_per_s']:7.0f} img/s ({row['mb_per_s']:.0f} MB/s)")
    return row


def peer_rows(
    args: argparse.Namespace,
    local: Path,
    work: Path,
    endpoint: str,
    sizes: tuple[int, int],
    *,
    shard_gets: Any,
) -> list[dict[str, Any]]:
    """Peer rows, uncapped and capped; a peer not installed is skipped with one line.
    ``sizes``: the set's sample count and the capped rows' cache limit."""
    num_samples, quarter = sizes
    tag = row_suffix(args.encoding)
    rows: list[dict[str, Any]] = []
    for module, package in _storage_peers.PEERS:
        if args.only and package not in args.only:
            continue
        try:
            __import__(module)
        except ImportError:
            print(f"{package}: skipped (not installed; pip install {package} in a venv with "
                  "torch pinned)")  # fmt: skip
            rows.append({"name": package + tag, "skipped": "not installed"})
            continue
        started = time.perf_counter()
        prefix = _storage_peers.prepare(package, local, work, _BUCKET, int(args.shard_mb * 2**20))
        print(f"{package}: shards written and uploaded in {time.perf_counter() - started:.1f} s",
              flush=True)  # fmt: skip
        for suffix, limit in (("", None), ("-capped", quarter)):
            spec = {
                "kind": "peer",
                "name": package + suffix + tag,
                "peer": package,
                "prefix": prefix,
                "endpoint": endpoint,
                "cache": work / f"cache-{package}{suffix}",
                "limit": limit,
                "workers": args.workers,
                "num_samples": num_samples,
                "encoding": args.encoding,
            }
            rows.append(run_row(spec, args.row_time_limit, shard_gets))
    return rows


def row_suffix(encoding: str) -> str:
    """What the row names of a run end in: nothing from raw shards, ``-jpeg`` from JPEG."""
    return "" if encoding == "raw" else f"-{encoding}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--shard-mb", type=float, default=10.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window-shards", type=int, default=4,
                        help="shards the sampler of fastdata's rows shuffles together")  # fmt: skip
    parser.add_argument("--row-time-limit", type=float, default=300.0,
                        help="seconds a row may take (build and two epochs) before it is "
                        "stopped and recorded as failed")  # fmt: skip
    parser.add_argument("--only", nargs="*", default=(),
                        help="rows to run: fastdata and/or peer names (default: all)")  # fmt: skip
    parser.add_argument("--encoding", choices=("raw", "jpeg"), default="raw",
                        help="how the shards store the photos: raw 224x224 pixels, or JPEGs "
                        "that every row decodes in its loader's workers")  # fmt: skip
    add_publish_argument(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-storage-"))
    os.environ["FASTDATA_CACHE_DIR"] = str(work / "staging")  # preprocess's staging folder
    try:
        photos = make_photos(work / "photos", args.num_images)
        local = work / "local"
        options = PreprocessOptions(
            sizes=(224,), shard_bytes=int(args.shard_mb * 2**20), storage=args.encoding
        )
        preprocess(photos, local, options, show_progress=False)
        manifest = load_manifest(local)
        shard_gets = multiprocessing.get_context("spawn").Array(
            "q", len(manifest.shards), lock=False
        )
        with s3_server(args.latency_ms, shard_gets) as endpoint:
            os.environ.update(
                AWS_ENDPOINT_URL=endpoint,
                AWS_ACCESS_KEY_ID="bench",
                AWS_SECRET_ACCESS_KEY="bench",
                AWS_DEFAULT_REGION="us-east-1",
            )
            boto3.client("s3").create_bucket(Bucket=_BUCKET)
            started = time.perf_counter()
            url = f"s3://{_BUCKET}/photos/"
            preprocess(photos, url, options, show_progress=False)
            upload_s = time.perf_counter() - started
            print(f"{manifest.num_samples} images in {len(manifest.shards)} shards of "
                  f"~{args.shard_mb:g} MiB ({manifest.num_bytes / 2**20:.0f} MiB); "
                  f"preprocess to s3:// {upload_s:.1f} s; {args.latency_ms:g} ms per request; "
                  f"{args.workers} workers; {args.encoding} shards")  # fmt: skip
            quarter = max(manifest.num_bytes // 4, *(s.num_bytes for s in manifest.shards))
            ceiling = server_ceiling(url, manifest.num_samples)
            own = {"kind": "fastdata", "workers": args.workers, "limit": None, "cache": None,
                   "window_shards": args.window_shards, "encoding": args.encoding}  # fmt: skip
            tag = row_suffix(args.encoding)
            rows = []
            if not args.only or "fastdata" in args.only:
                remote = {**own, "path": url}
                for spec in (
                    {**own, "name": "local" + tag, "path": str(local)},
                    {**remote, "name": "fastdata-s3" + tag, "cache": work / "cache-full"},
                    {**remote, "name": "fastdata-s3-capped" + tag, "limit": quarter,
                     "cache": work / "cache-q"},
                ):  # fmt: skip
                    rows.append(run_row(spec, args.row_time_limit, shard_gets))
            rows.append(ceiling)
            rows += peer_rows(
                args, local, work, endpoint, (manifest.num_samples, quarter), shard_gets=shard_gets
            )
        topic = "storage" + row_suffix(args.encoding)
        save(topic, {"settings": vars(args), "rows": rows}, publish=args.publish)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

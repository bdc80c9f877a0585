"""Reading shards from an S3-protocol store: fastdata's cache against local disk and peers.

One run: the same photos, preprocessed to raw 224x224 shards of about ``--shard-mb`` MiB,
served by moto's S3 server on 127.0.0.1 (a separate process) behind a proxy that adds
``--latency-ms`` to every request. Each row reads two epochs with a DataLoader of
``--workers`` workers in the shard-aware shuffled order and reports, per epoch, images/s;
client CPU ms per image (this process and its workers; the server is not counted); the
cache folder's peak bytes (sampled in a thread) against its limit; peak RSS; the time to
build the dataset; and whether every sample came exactly once.

Rows: ``local`` (the same set on disk), ``fastdata-s3`` (no limit), ``fastdata-s3-capped``
(``cache_limit`` a quarter of the set). Peers (LitData, MosaicML streaming, webdataset)
run when installed, each from the same photos in its own format; a missing one is skipped
with one line. Figures measured on a shared machine are indicative; rerun with:

    python benchmarks/bench_storage.py [--num-images 2000] [--latency-ms 20] [--publish]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _serve_proxy(upstream: str, port_queue: Any, latency_s: float) -> None:
    proxy = FaultProxy(upstream)
    proxy.latency_s = latency_s
    port_queue.put(proxy.port)
    threading.Event().wait()


@contextlib.contextmanager
def s3_server(latency_ms: float) -> Iterator[str]:
    """An S3 server and a latency proxy, each in its own process; yields the proxy URL."""
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
        target=_serve_proxy, args=(f"127.0.0.1:{port}", ports, latency_ms / 1000), daemon=True
    )
    proxy.start()
    try:
        yield f"http://127.0.0.1:{ports.get(timeout=60)}"
    finally:
        proxy.terminate()
        server.terminate()


class Peaks:
    """Samples the cache folder's bytes and this process tree's RSS in a thread."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.cache_bytes = 0
        self.rss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.01):
            if self.folder is not None and self.folder.exists():
                total = 0
                for entry in os.scandir(self.folder):
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat().st_size if entry.is_file() else 0
                self.cache_bytes = max(self.cache_bytes, total)
            with contextlib.suppress(psutil.Error):
                processes = [me, *me.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in processes if p.name() != "moto_server")
                self.rss_bytes = max(self.rss_bytes, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_fastdata(
    name: str, path: str, args: argparse.Namespace, cache: Path | None, limit: int | None
) -> dict[str, Any]:
    peaks = Peaks(cache)
    started = time.perf_counter()
    dataset = ShardDataset(path, ("image", "path"), cache_dir=cache, cache_limit=limit)
    build_s = time.perf_counter() - started
    sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=64,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=passthrough_collate,
        persistent_workers=args.workers > 0,
    )
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen: list[str] = []
        cpu, clock = _cpu_s(), time.perf_counter()
        for _, paths in loader:
            seen.extend(paths)
        elapsed, cpu = time.perf_counter() - clock, _cpu_s() - cpu
        epochs.append({
            "images_per_s": round(len(seen) / elapsed, 1),
            "cpu_ms_per_image": round(1000 * cpu / max(len(seen), 1), 3),
            "every_sample_once": len(set(seen)) == len(seen) == len(dataset),
        })  # fmt: skip
    del loader
    peaks.stop()
    row = {"name": name, "build_s": round(build_s, 3), "epochs": epochs,
           "peak_cache_bytes": peaks.cache_bytes, "cache_limit_bytes": limit,
           "peak_rss_mb": round(peaks.rss_bytes / 2**20, 1)}  # fmt: skip
    print(
        f"{name:22s} build {build_s:6.2f} s | "
        + " | ".join(
            f"epoch {i + 1}: {e['images_per_s']:8.0f} img/s, {e['cpu_ms_per_image']:.2f} ms CPU/img"
            + ("" if e["every_sample_once"] else " (SAMPLES WRONG)")
            for i, e in enumerate(epochs)
        )
        + f" | cache peak {peaks.cache_bytes / 2**20:.1f} MiB"
        + (f" (limit {limit / 2**20:.1f})" if limit else "")
        + f" | RSS peak {peaks.rss_bytes / 2**20:.0f} MiB"
    )
    return row


def run_peers(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Peer rows: each needs its own conversion of the photos and reading code; those not
    installed are skipped with one line."""
    rows = []
    for module, package in (("litdata", "litdata"), ("streaming", "mosaicml-streaming"),
                            ("webdataset", "webdataset")):  # fmt: skip
        try:
            __import__(module)
        except ImportError:
            print(f"{package}: skipped (not installed; pip install {package} in a venv with "
                  "torch pinned)")  # fmt: skip
            continue
        print(f"{package}: installed, but its row is not implemented in this script yet")
        rows.append({"name": package, "skipped": "not implemented"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--shard-mb", type=float, default=10.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    add_publish_argument(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-storage-"))
    os.environ["FASTDATA_CACHE_DIR"] = str(work / "staging")  # preprocess's staging folder
    try:
        photos = make_photos(work / "photos", args.num_images)
        local = work / "local"
        options = PreprocessOptions(sizes=(224,), shard_bytes=int(args.shard_mb * 2**20))
        preprocess(photos, local, options, show_progress=False)
        manifest = load_manifest(local)
        with s3_server(args.latency_ms) as endpoint:
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
                  f"{args.workers} workers")  # fmt: skip
            rows = [run_fastdata("local", str(local), args, None, None)]
            rows.append(run_fastdata("fastdata-s3", url, args, work / "cache-full", None))
            quarter = max(manifest.num_bytes // 4, *(s.num_bytes for s in manifest.shards))
            rows.append(run_fastdata("fastdata-s3-capped", url, args, work / "cache-q", quarter))
            rows.extend(run_peers(args))
        save("storage", {"settings": vars(args), "rows": rows}, publish=args.publish)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The peer rows of ``bench_storage.py``: LitData, MosaicML streaming and webdataset.

Each peer gets the same samples as fastdata's shards, written in its own format in shards
of about the same size, uploaded to the same bucket, and read back through the same latency
proxy with its own loader, cache folder and cache limit. From raw shards (``encoding
"raw"``) a sample is the decoded 224x224 photo (the ``image`` field of the local set, a
uint8 array); from JPEG shards (``"jpeg"``) it is the very JPEG bytes of fastdata's
``image`` field, which the peer's dataset decodes in its loader's workers with
``cv2.imdecode``, as a user of that peer would write it (a ``__getitem__`` override for
LitData and MosaicML streaming, a ``map_tuple`` stage for webdataset), so every row
decodes the same bytes. A reader is a function ``(settings) -> (build_s, epochs)`` where
``epochs`` yields, for each of two epochs, an iterator of the sample keys of each batch;
the bench times and checks it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import cv2
import numpy as np

from fastdata import ShardDataset
from fastdata.shards import load_manifest

PEERS = (("litdata", "litdata"), ("streaming", "mosaicml-streaming"),
         ("webdataset", "webdataset"))  # fmt: skip


@dataclass
class PeerSettings:
    """Where a peer row reads from and caches to."""

    bucket: str
    prefix: str
    endpoint: str
    cache: Path
    limit_bytes: int | None
    workers: int
    encoding: str = "raw"
    batch_size: int = 64


Reader = Callable[[PeerSettings], tuple[float, Iterator[Iterator[list[str]]]]]


def samples(local: Path) -> Iterator[tuple[str, np.ndarray]]:
    """``(key, image)`` of every sample of the local fastdata set, in storage order: the
    decoded uint8 ``(H, W, C)`` array of a raw set, the encoded uint8 bytes of a JPEG set."""
    if load_manifest(local).field("image").kind == "encoded":
        dataset = ShardDataset(local, ("image",), decode=False)
    else:
        dataset = ShardDataset(local, ("image",), layout="HWC")
    for index in range(len(dataset)):
        yield f"{index:06d}", np.ascontiguousarray(np.asarray(dataset[index]))


def decode_jpeg(data: bytes | np.ndarray) -> np.ndarray:
    """A JPEG's ``(H, W, 3)`` uint8 pixels, as a peer's user decodes them."""
    buffer = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else np.asarray(data)
    image = cv2.imdecode(buffer, cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError("a sample's JPEG bytes do not decode")
    return image


def decoding(base: type, name: str) -> type:
    """``base`` (a peer's dataset class) with ``__getitem__`` decoding the ``image`` JPEG;
    registered in this module under ``name`` so that it pickles."""
    existing = globals().get(name)
    parent: Any = base
    if isinstance(existing, type):
        return existing

    def __getitem__(self: Any, index: Any) -> Any:  # noqa: N807 - the override
        sample: Any = parent.__getitem__(self, index)
        sample["image"] = decode_jpeg(sample["image"])
        return sample

    subclass = type(name, (base,), {"__getitem__": __getitem__, "__module__": __name__})
    globals()[name] = subclass
    return subclass


def upload_folder(folder: Path, bucket: str, prefix: str) -> None:
    client = boto3.client("s3")
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}{path.relative_to(folder)}")


# -- LitData -------------------------------------------------------------------------------
def write_litdata(local: Path, out: Path, shard_bytes: int) -> None:
    from litdata.streaming.writer import BinaryWriter  # noqa: PLC0415 - a peer, optional

    writer = BinaryWriter(str(out), chunk_bytes=shard_bytes)
    for index, (key, image) in enumerate(samples(local)):
        writer[index] = {"key": key, "image": image}
    writer.done()
    writer.merge()


def _litdata_allow_http(*_: object) -> None:
    """LitData's boto3 client takes the endpoint; its obstore client (chunk downloads, in
    worker processes it may start fresh) reaches an ``http://`` endpoint only with
    ``allow_http`` in its client options: set in the loader and in each worker."""
    from litdata.streaming import downloader  # noqa: PLC0415 - a peer, optional

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]


def read_litdata(settings: PeerSettings) -> tuple[float, Iterator[Iterator[list[str]]]]:
    import time  # noqa: PLC0415 - a peer, optional

    from litdata import StreamingDataLoader, StreamingDataset  # noqa: PLC0415 - a peer, optional
    from litdata.streaming.resolver import Dir  # noqa: PLC0415 - a peer, optional

    started = time.perf_counter()
    _litdata_allow_http()
    options = {"endpoint_url": settings.endpoint}
    extra: dict[str, Any] = {}
    if settings.limit_bytes is not None:
        extra["max_cache_size"] = settings.limit_bytes
    dataset_class = (
        decoding(StreamingDataset, "LitDataDecoding")
        if settings.encoding == "jpeg"
        else StreamingDataset
    )
    dataset = dataset_class(
        Dir(path=str(settings.cache), url=f"s3://{settings.bucket}/{settings.prefix}"),
        shuffle=True,
        storage_options=options,
        **extra,
    )
    loader = StreamingDataLoader(
        dataset,
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        worker_init_fn=_litdata_allow_http,
    )
    build_s = time.perf_counter() - started

    def epoch() -> Iterator[list[str]]:
        for batch in loader:
            yield list(batch["key"])

    return build_s, (epoch() for _ in range(2))


# -- MosaicML streaming --------------------------------------------------------------------
def write_streaming(local: Path, out: Path, shard_bytes: int) -> None:
    from streaming import MDSWriter  # noqa: PLC0415 - a peer, optional

    columns = {"key": "str", "image": "ndarray:uint8"}
    with MDSWriter(out=str(out), columns=columns, size_limit=shard_bytes) as writer:
        for key, image in samples(local):
            writer.write({"key": key, "image": image})


def read_streaming(settings: PeerSettings) -> tuple[float, Iterator[Iterator[list[str]]]]:
    import time  # noqa: PLC0415 - a peer, optional

    from streaming import StreamingDataLoader, StreamingDataset  # noqa: PLC0415 - a peer, optional
    from streaming.base.util import clean_stale_shared_memory  # noqa: PLC0415 - a peer, optional

    os.environ["S3_ENDPOINT_URL"] = settings.endpoint
    clean_stale_shared_memory()
    started = time.perf_counter()
    dataset_class = (
        decoding(StreamingDataset, "StreamingDecoding")
        if settings.encoding == "jpeg"
        else StreamingDataset
    )
    dataset = dataset_class(
        remote=f"s3://{settings.bucket}/{settings.prefix}",
        local=str(settings.cache),
        shuffle=True,
        batch_size=settings.batch_size,
        cache_limit=settings.limit_bytes,
    )
    loader = StreamingDataLoader(
        dataset, batch_size=settings.batch_size, num_workers=settings.workers
    )
    build_s = time.perf_counter() - started

    def epoch() -> Iterator[list[str]]:
        for batch in loader:
            yield list(batch["key"])

    return build_s, (epoch() for _ in range(2))


# -- webdataset ----------------------------------------------------------------------------
def write_webdataset(local: Path, out: Path, shard_bytes: int) -> None:
    import webdataset as wds  # noqa: PLC0415 - a peer, optional

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=shard_bytes, verbose=0) as sink:
        for key, image in samples(local):
            if image.ndim == 1:  # a JPEG's bytes
                sink.write({"__key__": key, "jpg": image.tobytes()})
            else:
                sink.write({"__key__": key, "npy": image})


def read_webdataset(settings: PeerSettings) -> tuple[float, Iterator[Iterator[list[str]]]]:
    """Over HTTP with curl (webdataset has no ``s3://`` opener), from presigned URLs."""
    import time  # noqa: PLC0415 - a peer, optional

    import webdataset as wds  # noqa: PLC0415 - a peer, optional
    from torch.utils.data import DataLoader  # noqa: PLC0415 - a peer, optional

    started = time.perf_counter()
    client = boto3.client("s3")
    keys = sorted(
        item["Key"]
        for item in client.list_objects_v2(Bucket=settings.bucket, Prefix=settings.prefix)[
            "Contents"
        ]
    )
    urls = [
        "pipe:curl -s -f '"
        + client.generate_presigned_url(
            "get_object", Params={"Bucket": settings.bucket, "Key": key}, ExpiresIn=3600
        )
        + "'"
        for key in keys
    ]
    settings.cache.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {"cache_dir": str(settings.cache)}
    if settings.limit_bytes is not None:
        extra["cache_size"] = settings.limit_bytes
    shuffled = wds.WebDataset(
        urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, **extra
    ).shuffle(1000)
    if settings.encoding == "jpeg":
        pairs = shuffled.to_tuple("__key__", "jpg").map_tuple(str, decode_jpeg)
    else:
        pairs = shuffled.decode().to_tuple("__key__", "npy")
    dataset = pairs.batched(settings.batch_size)
    loader = DataLoader(dataset, batch_size=None, num_workers=settings.workers)
    build_s = time.perf_counter() - started

    def epoch() -> Iterator[list[str]]:
        for keys_batch, _ in loader:
            yield list(keys_batch)

    return build_s, (epoch() for _ in range(2))


WRITERS: dict[str, Callable[[Path, Path, int], None]] = {
    "litdata": write_litdata,
    "mosaicml-streaming": write_streaming,
    "webdataset": write_webdataset,
}
READERS: dict[str, Reader] = {
    "litdata": read_litdata,
    "mosaicml-streaming": read_streaming,
    "webdataset": read_webdataset,
}


def prepare(package: str, local: Path, work: Path, bucket: str, shard_bytes: int) -> str:
    """Write the peer's shards from the local set, upload them; returns their prefix."""
    out = work / f"peer-{package}"
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(out)
    WRITERS[package](local, out, shard_bytes)
    prefix = f"{package}/"
    upload_folder(out, bucket, prefix)
    shutil.rmtree(out, ignore_errors=True)
    return prefix

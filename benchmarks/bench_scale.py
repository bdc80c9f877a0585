"""Scale-out figures, measured in one run on this machine.

1. Preprocessing throughput of the Ray engine relative to the local engine (same job,
   same shards, byte-compared): Ray on a running instance ("warm", what a cluster job
   sees) and Ray started by the job itself ("cold", ``fastdata preprocess --engine ray``
   without ``--address``). Target: warm >= 0.8 of local.
2. Memory of a RAMDataset with 2 local ranks (gloo, CPU): one node-shared copy
   (``share_on_node``) versus a copy per rank, as the PSS of fastdata's shared-memory
   buffers summed over the ranks. Target: shared <= 0.6 of per-rank.

    python benchmarks/bench_scale.py [--num-images 2000] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from _harness import (  # benchmarks/ is on sys.path when run as a script
    REPO_ROOT,
    add_publish_argument,
    load_tool,
    save,
)

from fastdata._system import usable_cpus
from fastdata.preprocess import PreprocessOptions, RayEngine, preprocess

# Ray, torch and fastdata.datasets are imported inside the functions that use them: the
# local engine's spawned workers re-import this script's top-level imports, and these
# three took 3.7 s per worker here, which the local engine's figure used to include.

ensure_sample_dataset = load_tool("make_sample_dataset").ensure_sample_dataset

_SHARDS_PER_WORKER = 6  # a shard is one Ray task: several per CPU keep every CPU busy
_RANKS = 2


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def measure_engines(src: Path, work: Path, num_images: int, workers: int) -> dict[str, Any]:
    sample_bytes = 224 * 224 * 3 + 64
    shard_bytes = max(sample_bytes, num_images * sample_bytes // (workers * _SHARDS_PER_WORKER))
    options = PreprocessOptions(sizes=(224,), shard_bytes=shard_bytes)
    import ray  # noqa: PLC0415 - see the imports at the top; the ray extra

    local = preprocess(src, work / "local", options, workers=workers, show_progress=False)
    cold = preprocess(
        src, work / "cold", options, engine=RayEngine(num_cpus=workers), show_progress=False
    )
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:  # a first job starts the worker processes; the second one is timed
        engine = RayEngine()
        preprocess(src, work / "warm", options, engine=engine, show_progress=False)
        warm = preprocess(
            src, work / "warm", options, engine=engine, overwrite=True, show_progress=False
        )
    finally:
        ray.shutdown()
    return {
        "images": local.num_processed,
        "shards": local.num_shards,
        "workers": workers,
        "local_images_per_s": local.images_per_s,
        "ray_warm_images_per_s": warm.images_per_s,
        "ray_cold_images_per_s": cold.images_per_s,
        "ray_warm_over_local": warm.images_per_s / local.images_per_s,
        "ray_cold_over_local": cold.images_per_s / local.images_per_s,
        "byte_identical": _same_files(work / "local", work / "warm")
        and _same_files(work / "local", work / "cold"),
    }


def _rank(rank: int, shards: str, store: str, out: str) -> None:
    import torch.distributed as dist  # noqa: PLC0415 - see the imports at the top

    from fastdata.datasets import RAMDataset, share_on_node  # noqa: PLC0415
    from fastdata.datasets.node_shared import shared_memory_usage  # noqa: PLC0415

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=_RANKS,
        timeout=timedelta(minutes=10),
    )
    try:
        report: dict[str, Any] = {}
        for mode in ("shared", "per_rank"):

            def build() -> RAMDataset:
                return RAMDataset.from_shards(
                    shards, fields=("image", "label"), show_progress=False
                )

            dataset = share_on_node(build) if mode == "shared" else build()
            dataset.__getitems__(list(range(len(dataset))))  # touch every page, as an epoch does
            dist.barrier()
            report[mode] = shared_memory_usage()
            report["dataset_bytes"] = dataset.nbytes
            dist.barrier()
            dataset.close()
            del dataset
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def measure_memory(shards: Path, work: Path) -> dict[str, Any]:
    import torch.multiprocessing as mp  # noqa: PLC0415 - see the imports at the top

    mp.spawn(_rank, args=(str(shards), str(work / "store"), str(work)), nprocs=_RANKS)
    ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(_RANKS)]
    shared = sum(r["shared"]["pss_bytes"] for r in ranks)
    per_rank = sum(r["per_rank"]["pss_bytes"] for r in ranks)
    return {
        "ranks": _RANKS,
        "dataset_bytes": ranks[0]["dataset_bytes"],
        "shared_pss_bytes_total": shared,
        "per_rank_pss_bytes_total": per_rank,
        "shared_over_per_rank": shared / per_rank,
        "per_rank_pss_bytes": {
            m: [r[m]["pss_bytes"] for r in ranks] for m in ("shared", "per_rank")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=usable_cpus())
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "demo-data")
    add_publish_argument(parser)
    args = parser.parse_args()
    src = ensure_sample_dataset(args.data / f"sample-{args.num_images}", args.num_images)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.data))
    try:
        engines = measure_engines(src, work, args.num_images, args.workers)
        memory = measure_memory(work / "local", work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save("scale", {"engines": engines, "memory": memory}, publish=args.publish)
    print(
        f"{engines['images']} sample JPEGs -> raw 224, {engines['shards']} shards, "
        f"{engines['workers']} CPUs"
    )
    print(
        f"local {engines['local_images_per_s']:6.0f} img/s | Ray warm "
        f"{engines['ray_warm_images_per_s']:6.0f} img/s ({engines['ray_warm_over_local']:.2f}x) "
        f"| Ray cold {engines['ray_cold_images_per_s']:6.0f} img/s "
        f"({engines['ray_cold_over_local']:.2f}x) | byte-identical {engines['byte_identical']}"
    )
    mib = 2**20
    ratio = memory["shared_over_per_rank"]
    print(
        f"RAMDataset of {memory['dataset_bytes'] / mib:.0f} MiB, {memory['ranks']} ranks: "
        f"node-shared {memory['shared_pss_bytes_total'] / mib:.0f} MiB PSS vs per-rank "
        f"{memory['per_rank_pss_bytes_total'] / mib:.0f} MiB ({ratio:.2f}x)"
    )


if __name__ == "__main__":
    main()

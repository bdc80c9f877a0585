"""`make demo`: write a small shard set and read it back, printing what was measured."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, save_manifest


def main() -> None:
    num_samples, batch_size = 2048, 64
    fields = [
        FieldSpec("image", "array", "uint8", (224, 224, 3), "HWC"),
        FieldSpec("label", "array", "int64"),
    ]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        with ShardWriter(root / "shard-00000.h5", fields) as writer:
            for i in range(num_samples):
                writer.append(
                    {"image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), "label": i % 10}
                )
            info = writer.close()
        save_manifest(root, Manifest(fields=fields, shards=[info]))
        write_s = time.perf_counter() - started
        reader = ShardReader(root)
        order = rng.permutation(num_samples)
        started = time.perf_counter()
        for start in range(0, num_samples, batch_size):
            reader.read_batch("image", order[start : start + batch_size])
        read_s = time.perf_counter() - started
    print(
        f"wrote {num_samples} images in {write_s:.2f} s; "
        f"random batched reads: {num_samples / read_s:,.0f} images/s"
    )


if __name__ == "__main__":
    main()

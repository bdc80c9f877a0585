"""Training-time datasets that feed the standard ``DataLoader`` whole uint8 batches.

- :class:`ShardDataset`: memory-mapped shard sets (``fastdata preprocess`` output).
- :class:`RAMDataset`: a dataset in shared RAM (encoded files, shards or arrays).
- :class:`ReadOptions`: how both read samples (layout, decoding, errors, threads), as one
  value.
- :func:`passthrough_collate`: the ``collate_fn`` for their ready-made batches (the
  default collate recognises them too); :class:`RaggedCollate` and :func:`pad_ragged` turn
  variable-length fields (boxes) into padded ``(B, max_N, ...)`` tensors and counts.
- :class:`ResumableDataLoader`: a ``DataLoader`` whose ``state_dict()`` resumes mid-epoch
  exactly with workers (``dataset.loader(...)`` makes one).
- :class:`ShardAwareDistributedSampler`: DDP sampling that keeps each rank on its shards.
- :func:`share_on_node`: one ``RAMDataset`` per node for all its local ranks.

Both expose a settable ``num_threads`` (threads used by ``__getitems__`` in the calling
process): the ``fastdata.tune`` autotuner tries ``num_workers=0`` with several
``num_threads`` against worker processes.
"""

from fastdata.datasets._collate import RaggedCollate, pad_ragged, passthrough_collate
from fastdata.datasets._loader import ResumableDataLoader
from fastdata.datasets._memory import MemoryReport
from fastdata.datasets._options import ReadOptions
from fastdata.datasets.distributed import ShardAwareDistributedSampler
from fastdata.datasets.node_shared import share_on_node
from fastdata.datasets.ram_dataset import RAMDataset
from fastdata.datasets.shard_dataset import ShardDataset

__all__ = [
    "MemoryReport",
    "RAMDataset",
    "RaggedCollate",
    "ReadOptions",
    "ResumableDataLoader",
    "ShardAwareDistributedSampler",
    "ShardDataset",
    "pad_ragged",
    "passthrough_collate",
    "share_on_node",
]

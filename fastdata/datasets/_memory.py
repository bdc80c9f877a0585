"""Memory figures for in-RAM datasets: the check before loading and the report after."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastdata import _system
from fastdata.errors import InsufficientMemoryError


def check_memory(needed_bytes: int, *, what: str, override: bool) -> None:
    """Refuse to load ``needed_bytes`` when more than the available memory.

    Args:
        needed_bytes: Estimated bytes the load will allocate.
        what: What is being loaded, for the message.
        override: Load anyway (``check_memory=False`` in the datasets).

    Raises:
        InsufficientMemoryError: ``needed_bytes`` exceeds ``available_memory_bytes()``
            and ``override`` is false; the message names both figures.
    """
    available = _system.available_memory_bytes()
    if needed_bytes > available and not override:
        raise InsufficientMemoryError(
            f"loading {what} needs about {_system.format_bytes(needed_bytes)} "
            f"({needed_bytes} bytes) but only {_system.format_bytes(available)} "
            f"({available} bytes) is available to this process; free memory, use "
            "ShardDataset (memory-mapped) instead, or pass check_memory=False to load anyway"
        )


@dataclass(frozen=True)
class MemoryReport:
    """What an in-RAM dataset holds.

    Attributes:
        num_samples: Samples held.
        field_bytes: Bytes per stored field (payload plus offsets), e.g. ``{"image": ...}``.
        shared: The buffers live in shared memory (mapped, not copied, by workers).
        available_bytes: Memory still available to this process when the report was made.
    """

    num_samples: int
    field_bytes: dict[str, int] = field(default_factory=dict)
    shared: bool = True
    available_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.field_bytes.values())

    def __str__(self) -> str:
        fmt = _system.format_bytes
        lines = [f"{self.num_samples} samples, {fmt(self.total_bytes)} in RAM"]
        lines += [f"  {name}: {fmt(nbytes)}" for name, nbytes in self.field_bytes.items()]
        where = "shared memory (one copy for all workers)" if self.shared else "private memory"
        lines.append(f"  storage: {where}; available: {fmt(self.available_bytes)}")
        return "\n".join(lines)
